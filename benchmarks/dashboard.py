"""What the dashboard costs, side by side with `hotreload watch --no-tui`, in one run:

A. CPU while idle (no requests, no edits), in % of one core, over `--idle-s` seconds after
   warm-up: the manager process, plus the dashboard's own process under a terminal (it
   draws in a child process at nice 10). Target: the dashboard at its default refresh <= 5 %.
B. request p99 under the same closed-loop load (`--clients` clients for `--load-s`
   seconds) with the dashboard drawing and without. Target: ratio <= 1.10.

The dashboard runs under a real pseudo-terminal (120x36) whose output is read and dropped,
as a terminal would; modes alternate (plain, tui, plain, tui, ...) so drift hits both.

    .venv/bin/python benchmarks/dashboard.py [--rounds 2] [--idle-s 10] [--load-s 5]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil
from common import REPO, drive

from hotreload import Client
from hotreload.errors import HotreloadError


class Watch:
    """`hotreload watch` on a copy of the example; under a pty for the dashboard."""

    def __init__(self, config: Path, tui: bool) -> None:
        args = [sys.executable, "-m", "hotreload", "watch", "--config", str(config)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", TERM="xterm-256color")
        if tui:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
            self.proc = subprocess.Popen(
                args, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
            )
            os.close(slave)
            self._fd = master
        else:
            self.proc = subprocess.Popen(
                [*args, "--no-tui"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            assert self.proc.stdout is not None
            self._fd = self.proc.stdout.fileno()
        # Drain the output as a terminal would: a full pty would stall the app.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.client = Client(config=config, timeout_s=10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.client.status()["models"][0]["state"] == "serving":
                    return
            except (HotreloadError, OSError, KeyError, IndexError):
                pass
            time.sleep(0.2)
        raise RuntimeError("hotreload watch did not come up")

    def _drain(self) -> None:
        try:
            while os.read(self._fd, 65536):
                pass
        except OSError:
            pass

    def _own_processes(self) -> list[psutil.Process]:
        """The manager and, under a terminal, its dashboard process (workers excluded)."""
        manager = psutil.Process(self.proc.pid)
        return [manager] + [c for c in manager.children() if "dashboard" in c.cmdline()]

    def idle_cpu_pct(self, seconds: float) -> tuple[float, float]:
        """% of one core used by (the manager, the dashboard process), workers excluded."""
        procs = self._own_processes()
        t0, c0 = time.monotonic(), [p.cpu_times() for p in procs]
        time.sleep(seconds)
        t1, c1 = time.monotonic(), [p.cpu_times() for p in procs]
        used = [(b.user - a.user) + (b.system - a.system) for a, b in zip(c0, c1, strict=True)]
        pct = [100 * u / (t1 - t0) for u in used]
        return pct[0], sum(pct[1:])

    def stop(self) -> None:
        self.client.close()
        # The dashboard quits on SIGTERM (drain, stop workers); plain mode on SIGINT too.
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stdout is None:
            os.close(self._fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--load-s", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hotreload-bench-dash-"))
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj, ignore=shutil.ignore_patterns(".hotreload"))
    config = proj / "hotreload.toml"
    #: Idle % of a core per round: manager process, dashboard process (0 in plain mode).
    manager: dict[str, list[float]] = {"plain": [], "tui": []}
    drawer: dict[str, list[float]] = {"plain": [], "tui": []}
    p99: dict[str, list[float]] = {"plain": [], "tui": []}
    rps: dict[str, list[float]] = {"plain": [], "tui": []}
    try:
        for r in range(args.rounds):
            for mode in ("plain", "tui"):
                w = Watch(config, tui=mode == "tui")
                try:
                    time.sleep(2.0)  # past start-up: the first samples, imports, first paint
                    mgr, dash = w.idle_cpu_pct(args.idle_s)
                    manager[mode].append(mgr)
                    drawer[mode].append(dash)
                    res = drive(str(w.client.socket_path), "mlp", args.clients, args.load_s)
                    p99[mode].append(res.p99)
                    rps[mode].append(res.rps)
                    print(
                        f"round {r + 1} {mode:<5} idle: manager {mgr:5.2f} %, dashboard process "
                        f"{dash:5.2f} % of a core   p99 {res.p99:6.3f} ms   {res.rps:7.0f} req/s   "
                        f"failed {res.failed}",
                        flush=True,
                    )
                finally:
                    w.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med_mgr = {k: statistics.median(v) for k, v in manager.items()}
    med_dash = statistics.median(drawer["tui"])
    p = {k: statistics.median(v) for k, v in p99.items()}
    print()
    print(f"{'mode':<22} {'manager %':>10} {'drawing %':>10} {'p99 ms':>9} {'req/s':>9}")
    for mode, label in (("plain", "watch --no-tui"), ("tui", "watch (dashboard)")):
        draw = med_dash if mode == "tui" else 0.0
        print(
            f"{label:<22} {med_mgr[mode]:>10.2f} {draw:>10.2f} {p[mode]:>9.3f} "
            f"{statistics.median(rps[mode]):>9.0f}"
        )
    # The dashboard's own cost: its process, plus what serving it adds to the manager.
    own = med_dash + max(0.0, med_mgr["tui"] - med_mgr["plain"])
    total = med_dash + med_mgr["tui"]
    print(
        f"\ndashboard idle, its own cost (its process + the manager's extra): {own:.2f} % of a "
        f"core (target <= 5 %): {'ok' if own <= 5 else 'OVER'}"
    )
    print(f"everything of the session but its workers, with the dashboard: {total:.2f} %")
    ratio = p["tui"] / p["plain"]
    print(
        f"p99 dashboard / no-tui: {ratio:.3f} (target <= 1.10): {'ok' if ratio <= 1.10 else 'OVER'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

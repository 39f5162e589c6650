"""What the dashboard costs, side by side with `hotreload watch --no-tui`, in one run:

A. the manager process's CPU while idle (no requests, no edits), in % of one core, over
   `--idle-s` seconds after warm-up. Target: the dashboard at its default refresh <= 5 %.
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

    def idle_cpu_pct(self, seconds: float) -> float:
        """% of one core used by the manager process alone (workers excluded)."""
        p = psutil.Process(self.proc.pid)
        t0, c0 = time.monotonic(), p.cpu_times()
        time.sleep(seconds)
        t1, c1 = time.monotonic(), p.cpu_times()
        return 100 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)

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
    idle: dict[str, list[float]] = {"plain": [], "tui": []}
    p99: dict[str, list[float]] = {"plain": [], "tui": []}
    rps: dict[str, list[float]] = {"plain": [], "tui": []}
    try:
        for r in range(args.rounds):
            for mode in ("plain", "tui"):
                w = Watch(config, tui=mode == "tui")
                try:
                    time.sleep(2.0)  # past start-up: the first samples, imports, first paint
                    idle[mode].append(w.idle_cpu_pct(args.idle_s))
                    res = drive(str(w.client.socket_path), "mlp", args.clients, args.load_s)
                    p99[mode].append(res.p99)
                    rps[mode].append(res.rps)
                    print(
                        f"round {r + 1} {mode:<5} idle {idle[mode][-1]:5.2f} % of a core   "
                        f"p99 {res.p99:6.3f} ms   {res.rps:7.0f} req/s   failed {res.failed}",
                        flush=True,
                    )
                finally:
                    w.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in idle.items()}
    p = {k: statistics.median(v) for k, v in p99.items()}
    print()
    print(f"{'mode':<22} {'idle CPU %':>10} {'p99 ms':>9} {'req/s':>9}")
    for mode, label in (("plain", "watch --no-tui"), ("tui", "watch (dashboard)")):
        print(
            f"{label:<22} {med[mode]:>10.2f} {p[mode]:>9.3f} {statistics.median(rps[mode]):>9.0f}"
        )
    ratio = p["tui"] / p["plain"]
    print(
        f"\ndashboard idle: {med['tui']:.2f} % of a core (target <= 5 %): "
        f"{'ok' if med['tui'] <= 5 else 'OVER'}"
    )
    print(
        f"p99 dashboard / no-tui: {ratio:.3f} (target <= 1.10): {'ok' if ratio <= 1.10 else 'OVER'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reload benchmark on the example model, in one run:

A. edit-to-serving time, split into detect, debounce, drain, sync, load, warm, swap, for the
   `inplace` and `respawn` strategies, against a full restart of a fresh process (what
   `uvicorn --reload` does). Targets: hotreload's own overhead (total minus load and warm)
   under 150 ms; `inplace` under a quarter of the full restart.
B. 32 concurrent clients sending continuously through 20 reloads: failed requests (target
   0) and p99 inside reload windows divided by p99 in steady state (target <= 1.5 with the
   availability policy), against a naive baseline that loads on the serving thread.

    .venv/bin/python benchmarks/reload.py [--edits 5] [--reloads 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, LoadResult, Server, drive, percentile, read_events

PY = sys.executable


SLOW_BUILD = """

import time as _time

_fast_build = build


def build():
    _time.sleep({seconds})  # stands in for reading large weights from disk
    return _fast_build()
"""


def make_project(
    tmp: Path, name: str, strategy: str = "inplace", load_s: float = 0.0, standby: bool = True
) -> Path:
    proj = tmp / name
    shutil.copytree(REPO / "examples" / "mlp", proj)
    if load_s:
        with (proj / "model.py").open("a") as f:
            f.write(SLOW_BUILD.format(seconds=load_s))
    cfg = proj / "hotreload.toml"
    line = f'strategy = "{strategy}"' + ("" if standby else "\nstandby = false")
    cfg.write_text(cfg.read_text().replace('strategy = "inplace"', line))
    return cfg


def set_scale(cfg: Path, value: float) -> None:
    path = cfg.parent / "model.py"
    text = path.read_text()
    start = text.index("SCALE = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + f"SCALE = {value}" + text[end:])


def events(cfg: Path) -> list[dict[str, Any]]:
    return read_events(cfg.parent)


def watch_server(cfg: Path) -> Server:
    return Server(
        [PY, "-m", "hotreload", "watch", "--no-tui", "--config", str(cfg)], "serving ", cfg.parent
    )


# ----------------------------------------------------------------------------- part A


def edit_to_serving(cfg: Path, edits: int, wait_standby: bool = False) -> list[dict[str, float]]:
    """`wait_standby`: before each edit, wait for the standby worker (strategy respawn) to
    be ready, as it is when edits are seconds apart."""
    from hotreload.client import Client

    server = watch_server(cfg)
    rows = []
    try:
        client = Client(config=cfg)
        x = np.zeros((1, 64), np.float32)
        version = client.infer("mlp", x).version
        for k in range(edits):
            time.sleep(0.5)
            deadline = time.time() + 30
            while wait_standby and time.time() < deadline:
                if sum(e["kind"] == "standby_ready" for e in events(cfg)) > k:
                    break
                time.sleep(0.05)
            t0 = time.time()
            set_scale(cfg, 2.0 + k)
            while True:
                # A light poll (every 2 ms): a developer's loop, not a saturating load.
                r = client.infer("mlp", x)
                if r.version > version:
                    seen = time.time()
                    version = r.version
                    break
                time.sleep(0.002)
            time.sleep(0.3)  # let the release phase and its events land
            ev = [e for e in events(cfg) if e["ts"] >= t0]
            detected = next(e["ts"] for e in ev if e["kind"] == "change_detected")
            requested = next(e["ts"] for e in ev if e["kind"] == "reload_requested")
            done = next(e for e in ev if e["kind"] == "reload_done")
            ph = done["phases"]
            row = {
                "total": seen - t0,
                "detect": detected - t0,
                "debounce": requested - detected,
                **{p: ph.get(p, 0.0) for p in ("spawn", "drain", "sync", "load", "warm", "smoke")},
                "swap": ph.get("gate", 0.0) + ph.get("swap", 0.0) + ph.get("resume", 0.0),
            }
            row["overhead"] = row["total"] - row["load"] - row["warm"]
            rows.append(row)
    finally:
        server.stop()
    return rows


def full_restart(cfg: Path, runs: int) -> list[float]:
    """A fresh `hotreload serve` process until its first answer: what uvicorn --reload pays."""
    from hotreload.client import Client
    from hotreload.errors import NoServerError

    times = []
    for _ in range(runs):
        t0 = time.time()
        proc = Server(
            [PY, "-m", "hotreload", "serve", "--config", str(cfg)], "serving ", cfg.parent
        )
        try:
            client = Client(config=cfg)
            while True:
                try:
                    client.infer("mlp", np.zeros((1, 64), np.float32))
                    break
                except NoServerError:
                    time.sleep(0.005)
            times.append(time.time() - t0)
        finally:
            proc.stop()
    return times


# ----------------------------------------------------------------------------- part B


def windows_ratio(
    result: LoadResult, windows: list[tuple[float, float]], skip_s: float = 1.0
) -> tuple[float, float, float]:
    inside, steady = [], []
    for t, lat, _ in result.samples:
        if t < skip_s:
            continue
        (inside if any(a <= t <= b for a, b in windows) else steady).append(lat)
    p_in, p_steady = percentile(inside, 99), percentile(steady, 99)
    return p_in, p_steady, p_in / p_steady if p_steady else float("nan")


def under_load_hotreload(
    cfg: Path, reloads: int, period: float, clients: int
) -> tuple[LoadResult, list[tuple[float, float]]]:
    from hotreload.client import Client

    server = watch_server(cfg)
    try:
        sock = str(Client(config=cfg).socket_path)
        duration = 2.0 + reloads * period + 1.0
        box: list[LoadResult] = []
        t = threading.Thread(
            target=lambda: box.append(drive(sock, "mlp", clients, duration, procs=2))
        )
        t.start()
        time.sleep(1.5 + 2.0)  # process start-up + steady state first
        start_edits = time.time()
        for k in range(reloads):
            set_scale(cfg, 1.0 + (k + 1) / 10)
            time.sleep(period)
        t.join()
        result = box[0]
        ev = [e for e in events(cfg) if e["ts"] >= start_edits]
    finally:
        server.stop()
    # Sample times are relative to the drive's shared start instant.
    origin = result.origin
    windows, open_at = [], None
    for e in ev:
        if e["kind"] == "reload_requested" and open_at is None:
            open_at = e["ts"] - origin
        if e["kind"] in ("reload_done", "reload_failed") and open_at is not None:
            windows.append((open_at, e["ts"] - origin))
            open_at = None
    return result, windows


def under_load_naive(
    cfg: Path, reloads: int, period: float, clients: int, tmp: Path
) -> tuple[LoadResult, list[tuple[float, float]]]:
    from hotreload.client import Client

    sock = str(tmp / "naive.sock")
    server = Server(
        [PY, str(REPO / "benchmarks" / "naive_server.py"), sock, str(cfg.parent)],
        "naive ready",
        cfg.parent,
    )
    try:
        duration = 2.0 + reloads * period + 1.0
        box: list[LoadResult] = []
        t = threading.Thread(
            target=lambda: box.append(drive(sock, "mlp", clients, duration, procs=2))
        )
        t.start()
        time.sleep(1.5 + 2.0)
        control = Client(socket_path=sock, timeout_s=60)
        spans = []
        for k in range(reloads):
            set_scale(cfg, 1.0 + (k + 1) / 10)
            a = time.time()
            control.call({"op": "reload"})
            spans.append((a, time.time()))
            time.sleep(max(0.0, period - (time.time() - a)))
        t.join()
    finally:
        server.stop()
    result = box[0]
    return result, [(a - result.origin, b - result.origin) for a, b in spans]


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--edits", type=int, default=5, help="edits per strategy in part A")
    parser.add_argument("--reloads", type=int, default=20, help="reloads under load in part B")
    parser.add_argument("--period", type=float, default=0.8, help="seconds between reloads (B)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--load-ms",
        type=float,
        default=300.0,
        help="extra time each build takes in part B (the example alone loads in ~10 ms)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hr-reload-bench-"))
    try:
        part_a = {
            "inplace": edit_to_serving(make_project(tmp, "a-inplace"), args.edits),
            "respawn": edit_to_serving(
                make_project(tmp, "a-respawn", "respawn"), args.edits, wait_standby=True
            ),
            "respawn, no standby": edit_to_serving(
                make_project(tmp, "a-respawn-cold", "respawn", standby=False), args.edits
            ),
        }
        restarts = full_restart(make_project(tmp, "restart"), 3)
        load_s = args.load_ms / 1000
        hr, hr_windows = under_load_hotreload(
            make_project(tmp, "b-hot", load_s=load_s), args.reloads, args.period, args.clients
        )
        naive, naive_windows = under_load_naive(
            make_project(tmp, "b-naive", load_s=load_s),
            args.reloads,
            args.period,
            args.clients,
            tmp,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("A. edit -> first answer from the new version (median of", args.edits, "edits, ms)")
    cols = (
        "total",
        "detect",
        "debounce",
        "drain",
        "sync",
        "spawn",
        "load",
        "warm",
        "smoke",
        "swap",
        "overhead",
    )
    print(f"{'strategy':<20}" + "".join(f"{c:>10}" for c in cols))
    for strategy, rows in part_a.items():
        med = {c: statistics.median(r[c] for r in rows) * 1000 for c in cols}
        print(f"{strategy:<20}" + "".join(f"{med[c]:>10.1f}" for c in cols))
    full = statistics.median(restarts) * 1000
    print(
        f"{'restart':<20}{full:>10.1f}   (fresh `hotreload serve` process until its first answer)"
    )
    inplace_total = statistics.median(r["total"] for r in part_a["inplace"]) * 1000
    overhead = statistics.median(r["overhead"] for r in part_a["inplace"]) * 1000
    print(f"inplace overhead (total - load - warm), target < 150 ms: {overhead:.1f} ms")
    print(f"inplace / full restart, target < 0.25: {inplace_total / full:.3f}")
    print()
    print(
        f"B. {args.clients} clients through {args.reloads} reloads ({args.period:g} s apart, "
        f"each build takes +{args.load_ms:g} ms)"
    )
    print(
        f"{'server':<28}{'sent':>8}{'ok':>8}{'failed':>8}{'p99 in':>10}{'p99 out':>10}{'ratio':>8}"
    )
    for label, res, win in (
        ("hotreload (availability)", hr, hr_windows),
        ("naive (load on serving thread)", naive, naive_windows),
    ):
        p_in, p_out, ratio = windows_ratio(res, win)
        print(
            f"{label:<28}{res.sent:>8}{res.ok:>8}{res.failed:>8}{p_in:>10.2f}{p_out:>10.2f}{ratio:>8.2f}"
        )
    print("target: hotreload failed = 0 and ratio <= 1.5")
    return 0


if __name__ == "__main__":
    sys.exit(main())

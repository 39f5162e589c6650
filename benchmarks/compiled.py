"""Compiled models reload like eager ones (issue 40): one run, a compiled model beside the
same model in eager mode, each under `hotreload watch` with traffic at 4 batch sizes.

Per model: a code edit (the graph changes: its compile, once, in the warm phase), a revert
(the graph of v1 again: Inductor's cache in the session's state), a weights edit (no
compile at all) and a restart (a fresh worker: the cache again). After each swap, the
requests of the next `--window` seconds: their p99 against the steady p99, and how many
paid a compile on the serving path (the worker's counter). Targets:

- p99 after each swap <= 1.3x the steady p99, with 0 requests paying a compile;
- a reload whose graph is unchanged (revert, weights, restart) <= 40% of the cold compile;
- the compiled model's weights edit <= 1.2x the eager model's;
- a code edit compiles once, before the swap, and nothing after it.

    .venv/bin/python benchmarks/compiled.py [--window 3] [--steady 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import Server, percentile, read_events

PY = sys.executable
#: Batch sizes the traffic cycles through (the "shapes served").
BATCHES = (1, 2, 4, 8)
IN, HIDDEN, OUT, DEPTH = 1024, 2048, 256, 3

MODEL = f"""
import torch
from torch import nn

SCALE = 1.0
COMPILED = {{compiled}}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear({IN}, {HIDDEN})
        self.hidden = nn.ModuleList(nn.Linear({HIDDEN}, {HIDDEN}) for _ in range({DEPTH}))
        self.out = nn.Linear({HIDDEN}, {OUT})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for layer in self.hidden:
            h = h + torch.relu(layer(h)) * 0.1
        return self.out(h) * SCALE


def build() -> nn.Module:
    net = Net()
    return torch.compile(net) if COMPILED else net


def example_input() -> torch.Tensor:
    return torch.ones(1, {IN})
"""

CONFIG = """
[[models]]
name = "net"
entry = "model.py:build"
example = "model.py:example_input"
weights = ["weights.safetensors"]
device = "cpu"
warmup_iters = 1
threads = 1
request_timeout_s = 120.0

[watch]
quiet_ms = 100
max_wait_ms = 1500
"""


def write_weights(proj: Path, seed: int) -> int:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(proj))
    try:
        import importlib

        spec = importlib.util.spec_from_file_location(f"net_{seed}", proj / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(proj))
    torch.manual_seed(seed)
    state = {k: v.contiguous() for k, v in module.Net().state_dict().items()}  # eager names
    tmp = proj / "weights.tmp"
    save_file(state, str(tmp))
    os.replace(tmp, proj / "weights.safetensors")
    return sum(t.numel() * t.element_size() for t in state.values())


def make_project(tmp: Path, compiled: bool) -> Path:
    proj = tmp / ("compiled" if compiled else "eager")
    proj.mkdir()
    (proj / "model.py").write_text(MODEL.format(compiled=compiled))
    (proj / "hotreload.toml").write_text(CONFIG)
    return proj


class Traffic:
    """One closed-loop client cycling through BATCHES: (sent at, ms, version) per request."""

    def __init__(self, proj: Path) -> None:
        from hotreload import Client

        self.client = Client(config=proj / "hotreload.toml", timeout_s=120)
        self.samples: list[tuple[float, float, int]] = []
        #: When each failed request was sent (a killed worker's request in progress fails).
        self.failed: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        rng = np.random.default_rng(0)
        self.inputs = [rng.standard_normal((b, IN), dtype=np.float32) for b in BATCHES]

    def prime(self) -> None:
        """Each shape once: the first version compiles them on the serving path (nothing
        was served before it to replay), as any server would."""
        for x in self.inputs:
            self.client.infer("net", x)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            x = self.inputs[i % len(self.inputs)]
            i += 1
            t0 = time.time()
            try:
                _, version, _ = self.client.infer("net", x)
            except Exception:
                self.failed.append(t0)
                continue
            self.samples.append((t0, (time.time() - t0) * 1000, version))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(180)

    def window(self, start: float, seconds: float) -> list[float]:
        return [ms for t, ms, _ in self.samples if start <= t < start + seconds]


def serving_compiles(traffic: Traffic) -> int:
    return int(traffic.client.status()["models"][0]["worker"].get("serving_compiles", 0))


def reload_events(proj: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(proj) if e.get("kind") == "reload_done"]


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


def edit_scale(proj: Path, value: float) -> None:
    path = proj / "model.py"
    text = path.read_text()
    start = text.index("SCALE = ")
    path.write_text(text[:start] + f"SCALE = {value}" + text[text.index("\n", start) :])


def run_model(tmp: Path, compiled: bool, window_s: float, steady_s: float) -> dict[str, Any]:
    proj = make_project(tmp, compiled)
    size = write_weights(proj, 1)
    t0 = time.time()
    server = Server(
        [PY, "-m", "hotreload", "watch", "--no-tui", "--config", str(proj / "hotreload.toml")],
        "serving ",
        proj,
        timeout_s=600,
    )
    figures: dict[str, Any] = {"size_mib": size / 2**20, "start_s": time.time() - t0}
    traffic = Traffic(proj)
    try:
        traffic.prime()
        primed = serving_compiles(traffic)
        traffic.start()
        time.sleep(steady_s)
        figures["steady_p99"] = percentile(traffic.window(0, time.time()), 99)
        # A weights edit takes about a second: three of them (their median), so one
        # scheduler hiccup on a shared CPU does not make the figure.
        steps: list[tuple[str, list[Any]]] = [
            ("code edit", [lambda: edit_scale(proj, 2.0)]),
            ("revert", [lambda: edit_scale(proj, 1.0)]),
            ("weights edit", [lambda seed=seed: write_weights(proj, seed) for seed in (2, 3, 4)]),
        ]
        rows = []
        for label, acts in steps:
            runs = []
            for act in acts:
                before = serving_compiles(traffic)
                n = len(reload_events(proj))
                act()
                done = wait_for(lambda n=n: reload_events(proj)[n:], 600, f"{label}'s reload")[0]
                time.sleep(window_s)
                after = traffic.window(done["ts"], window_s)
                runs.append((done, after, serving_compiles(traffic) - before))
            done = sorted(runs, key=lambda r: r[0]["total_s"])[len(runs) // 2][0]
            rows.append(
                {
                    "step": label,
                    "reload_s": done["total_s"],
                    "phases": done.get("phases") or {},
                    "compile_s": (done.get("compile") or {}).get("seconds"),
                    "p99_after": max(percentile(after, 99) for _, after, _ in runs),
                    "requests_after": sum(len(after) for _, after, _ in runs),
                    "compiled_after": sum(c for _, _, c in runs),
                }
            )
        # Restarts: the worker killed, a fresh one builds the serving version again; first
        # with the compile cache emptied (a compile from nothing), then with it.
        kills: list[tuple[float, float]] = []
        for label, wipe in (("restart, cold", True), ("restart", False)):
            if wipe:
                shutil.rmtree(proj / ".hotreload" / "compile-cache", ignore_errors=True)
            old_pid = traffic.client.status()["models"][0]["pid"]
            killed = time.time()
            os.kill(old_pid, signal.SIGKILL)
            wait_for(
                lambda old_pid=old_pid: (
                    (s := traffic.client.status()["models"][0])["pid"] not in (None, old_pid)
                    and s["state"] == "serving"
                ),
                600,
                "the restart",
            )
            up = time.time()
            kills.append((killed, up))
            time.sleep(window_s)
            after = traffic.window(up, window_s)
            compile_now = traffic.client.status()["models"][0].get("compile") or {}
            rows.append(
                {
                    "step": label,
                    "reload_s": up - killed,
                    "compile_s": compile_now.get("seconds"),
                    "p99_after": percentile(after, 99),
                    "requests_after": len(after),
                    "compiled_after": serving_compiles(traffic),  # a new worker counts from 0
                }
            )
        # The request each kill took with it fails (never retried: it may be what killed it).
        killed_with = [t for t in traffic.failed if any(a - 1 <= t <= b for a, b in kills)]
        figures["failed_at_kills"] = len(killed_with)
        figures["failed"] = len(traffic.failed) - len(killed_with)
        figures.update(rows=rows, primed_compiles=primed)
    finally:
        traffic.stop()
        server.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=3.0, help="seconds after each swap")
    parser.add_argument("--steady", type=float, default=8.0, help="seconds of steady traffic")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hotreload-compiled-"))
    try:
        results = {
            kind: run_model(tmp, kind == "compiled", args.window, args.steady)
            for kind in ("eager", "compiled")
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nmodel {results['compiled']['size_mib']:.0f} MiB of weights, batches {BATCHES}")
    head = f"{'step':<14}{'model':<9}{'reload s':>9}{'compile s':>10}"
    print(head + f"{'p99 after':>10}{'x steady':>9}{'reqs':>6}{'compiled':>9}")
    ok = True
    for kind, r in results.items():
        print(
            f"{'start':<14}{kind:<9}{r['start_s']:>9.2f}{'':>10}"
            f"   steady p99 {r['steady_p99']:.1f} ms"
        )
    for i in range(len(results["eager"]["rows"])):
        for kind, r in results.items():
            row = r["rows"][i]
            ratio = row["p99_after"] / r["steady_p99"]
            compile_s = "-" if row["compile_s"] is None else f"{row['compile_s']:.2f}"
            print(
                f"{row['step']:<14}{kind:<9}{row['reload_s']:>9.2f}{compile_s:>10}"
                f"{row['p99_after']:>10.1f}{ratio:>9.2f}{row['requests_after']:>6}"
                f"{row['compiled_after']:>9}"
            )
            ok &= row["compiled_after"] == 0
    print("\nphases of each reload, ms (the median one where repeated):")
    for i in range(len(results["eager"]["rows"])):
        for kind, r in results.items():
            phases = r["rows"][i].get("phases") or {}
            if phases:
                shown = " ".join(f"{k} {v * 1000:.0f}" for k, v in phases.items())
                print(f"  {r['rows'][i]['step']:<13}{kind:<10}{shown}")
    c, e = results["compiled"]["rows"], results["eager"]["rows"]
    # The cold compile each unchanged graph is held against: the code edit's compile of a
    # new graph in the serving worker (revert, weights edit), a fresh worker's with an
    # empty cache (restart).
    code_edit, cold_restart = c[0]["reload_s"], c[3]["reload_s"]
    print("\ntargets (compiled model):")
    checks = [
        (
            "p99 after each swap <= 1.3x steady",
            max(r["p99_after"] for r in c) / results["compiled"]["steady_p99"],
            1.3,
        ),
        ("requests paying a compile after a swap", sum(r["compiled_after"] for r in c), 0),
        ("revert / code edit (a new graph compiled)", c[1]["reload_s"] / code_edit, 0.4),
        ("weights edit / code edit", c[2]["reload_s"] / code_edit, 0.4),
        ("restart / restart with the cache emptied", c[4]["reload_s"] / cold_restart, 0.4),
        ("weights edit, compiled / eager", c[2]["reload_s"] / e[2]["reload_s"], 1.2),
    ]
    for label, value, limit in checks:
        met = value <= limit
        ok &= met
        print(f"  {label:<42} {value:>7.2f}  (target <= {limit})  {'ok' if met else 'MISSED'}")
    failed = sum(r["failed"] for r in results.values())
    at_kills = sum(r["failed_at_kills"] for r in results.values())
    print(f"  failed requests: {failed} (and {at_kills} in progress on a killed worker)")
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())

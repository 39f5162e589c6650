"""What comparing golden outputs adds to a reload of the example MLP, side by side in one run.

Two `hotreload serve` sessions of examples/mlp, each reloaded `--reloads` times (a forced
build: load, warm, smoke, swap): one with the example's `golden` inputs, one without
(`golden` removed: the example alone is compared, the least a version runs). Per reload:
its total time, and the golden part of it: the worker's run of the golden inputs (the
diff's `seconds`) plus the engine's compare and its write of the version's .npz (timed here
on the same kept outputs). Target: the golden part at most 10% of the reload.

    .venv/bin/python benchmarks/golden.py [--reloads 15]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, Server

from hotreload import Client
from hotreload.engine import golden
from hotreload.engine.golden import GoldenStore

PY = sys.executable
GOLDEN_LINE = 'golden = "model.py:golden"'


def project(tmp: Path, name: str, with_golden: bool) -> Path:
    folder = tmp / name
    shutil.copytree(
        REPO / "examples" / "mlp",
        folder,
        ignore=shutil.ignore_patterns("__pycache__", ".hotreload"),
    )
    cfg = folder / "hotreload.toml"
    text = cfg.read_text()
    # The example ships its `golden` line commented out: switched on for the first row.
    assert "# " + GOLDEN_LINE in text, "examples/mlp/hotreload.toml lost its golden line"
    if with_golden:
        cfg.write_text(text.replace("# " + GOLDEN_LINE, GOLDEN_LINE, 1))
    return cfg


def engine_ms(store: GoldenStore, versions: list[int]) -> list[float]:
    """The engine's share per reload: compare with the version before, write the .npz."""
    out = []
    for old, new in itertools.pairwise(versions):
        a, b = store.load(old), store.load(new)
        assert a is not None and b is not None
        t0 = time.perf_counter()
        golden.compare(a, b)
        GoldenStore(store.folder.parent / "bench-copy").save(new, b)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(cfg: Path, reloads: int) -> dict[str, float]:
    server = Server([PY, "-m", "hotreload", "serve", "--config", str(cfg)], "serving ", cfg.parent)
    try:
        client = Client(config=cfg)
        totals, worker_ms = [], []
        for _ in range(reloads):
            outcome = client.reload("mlp", force=True)["outcomes"][0]
            assert outcome["ok"], outcome
            totals.append(outcome["total_s"] * 1000)
            diff = client.status()["models"][0]["golden"]
            assert diff is not None and diff["identical"], diff
            worker_ms.append(diff["seconds"] * 1000)
            inputs = diff["inputs"]
    finally:
        server.stop()
    store = GoldenStore(cfg.parent / ".hotreload" / "golden" / "mlp")
    eng = engine_ms(store, store.versions())
    total = statistics.median(totals)
    part = statistics.median(worker_ms) + statistics.median(eng)
    return {
        "inputs": inputs,
        "total": total,
        "worker": statistics.median(worker_ms),
        "engine": statistics.median(eng),
        "share": part / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = {
            "example + golden()": measure(project(tmp, "golden", True), args.reloads),
            "example alone": measure(project(tmp, "plain", False), args.reloads),
        }
    print(f"golden outputs on a reload of examples/mlp, median of {args.reloads} reloads")
    print(
        f"{'set':<20} {'inputs':>6} {'reload ms':>10} {'worker ms':>10} {'engine ms':>10} "
        f"{'share':>7}"
    )
    for name, r in rows.items():
        print(
            f"{name:<20} {r['inputs']:>6.0f} {r['total']:>10.1f} {r['worker']:>10.2f} "
            f"{r['engine']:>10.2f} {r['share'] * 100:>6.1f}%"
        )
    with_g, without = rows["example + golden()"], rows["example alone"]
    print(f"reload with golden() minus without: {with_g['total'] - without['total']:+.1f} ms")
    worst = max(r["share"] for r in rows.values())
    print(f"target: the golden part <= 10% of a reload: {'PASS' if worst <= 0.10 else 'FAIL'}")


if __name__ == "__main__":
    main()

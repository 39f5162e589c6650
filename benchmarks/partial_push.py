"""A push of a few tensors over a big frozen model, against a push of every tensor, side by
side in one run (issue 26 item 4: a frozen base costs nothing, on the serving side too).

benchmarks/scale.py's `Wide` model (about 100 MiB of float32 by default) served by
`hotreload serve` (`strategy` as given). Alternating, `--rounds` times each:

- full: every tensor pushed (`update_weights(state)`), all of them new to the worker;
- head: the last block's two tensors pushed alone (`strict=False`), the rest the same
  tensors as the version before.

Push -> first answer of the pushed version, and its build's load phase (where the digest
is computed) from `.hotreload/events.jsonl`. The head push's load should not grow with
the model: the worker hashes only the tensors new to it (worker/weights_digest.py).

    .venv/bin/python benchmarks/partial_push.py [--mib 100] [--rounds 8] [--strategy inplace]

Not a test: figures depend on the machine and its load; compare the two rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import scale
from common import Server, read_events

PY = sys.executable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=100, choices=sorted(scale.SHAPES))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--strategy", default="inplace", choices=("inplace", "respawn"))
    a = ap.parse_args()

    import torch
    from safetensors.torch import save_file

    from hotreload import Client

    width, depth = scale.SHAPES[a.mib]
    folder = Path(tempfile.mkdtemp(prefix="hr-partial-push-"))
    (folder / "model.py").write_text(scale.MODEL.format(width=width, depth=depth))
    (folder / "hotreload.toml").write_text(scale.CONFIG.format(strategy=a.strategy))
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(depth):
        state[f"blocks.{i}.weight"] = torch.randn(width, width, generator=g) / width**0.5
        state[f"blocks.{i}.bias"] = torch.zeros(width)
    save_file(state, str(folder / "weights.safetensors"))
    head = [f"blocks.{depth - 1}.weight", f"blocks.{depth - 1}.bias"]
    server = Server([PY, "-m", "hotreload", "serve"], "serving ", folder, timeout_s=600)
    x = torch.ones(1, width).numpy()
    rows: dict[str, list[tuple[float, float]]] = {"full": [], "head": []}
    try:
        with Client(config=folder / "hotreload.toml", timeout_s=600) as client:
            for r in range(a.rounds + 1):  # the first round is a warm-up, not counted
                for kind in ("full", "head"):
                    g.manual_seed(100 + r)
                    if kind == "full":
                        sent = {
                            k: v + 0.001 * torch.randn(v.shape, generator=g)
                            for k, v in state.items()
                        }
                        state = sent
                    else:
                        sent = {k: state[k] + 0.001 for k in head}
                    t0 = time.perf_counter()
                    reply = client.update_weights("wide", sent, strict=kind == "full")
                    client.infer("wide", x, min_version=reply["version"])
                    dt = time.perf_counter() - t0
                    done = [
                        e
                        for e in read_events(folder)
                        if e.get("kind") == "reload_done" and e.get("version") == reply["version"]
                    ]
                    load = done[-1]["phases"].get("load", float("nan")) if done else float("nan")
                    if r:
                        rows[kind].append((dt, load))
    finally:
        server.stop()
    mib = sum(t.nbytes for t in state.values()) / 2**20
    print(
        f"push over a {mib:.0f} MiB model ({a.strategy}), median of {a.rounds}: "
        "push -> first answer, and the build's load phase"
    )
    for kind, label in (("full", "every tensor"), ("head", "the last block only")):
        total = statistics.median(d for d, _ in rows[kind])
        load = statistics.median(load for _, load in rows[kind])
        print(f"  {label:<22} {total * 1000:8.1f} ms   load {load * 1000:8.1f} ms")
    full = statistics.median(load for _, load in rows["full"])
    part = statistics.median(load for _, load in rows["head"])
    print(f"  load ratio head/full {part / full:.3f}")


if __name__ == "__main__":
    main()

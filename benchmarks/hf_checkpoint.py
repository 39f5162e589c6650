"""What a transformers checkpoint in its original names costs to load, beside one in the
module's names, on the CPU, in process: build (init skipped) + load_weights, as a worker's
build does it (worker/fast_build.py, worker/weights.py, worker/hf_checkpoint.py).

    .venv/bin/python benchmarks/hf_checkpoint.py [--hidden 512] [--layers 4] [--experts 8]

A Mixtral built from its config: `save_pretrained` (original names: experts one by one, so
transformers' conversion stacks them) against `save_pretrained(save_original_format=False)`
(the module's names: no conversion), and the same file as 4 shards. Also from_pretrained on
the original-format folder, for scale. Best of a few runs. Not a test: figures depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    # A worker's torch threads are its config's `threads`; on a busy machine more than one
    # spins (a torch.stack of 100 MiB took 1.2 s on 2 threads, 0.2 s on 1).
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.utils import logging

    from hotreload.worker.fast_build import build_without_init
    from hotreload.worker.weights import load_weights

    logging.disable_progress_bar()
    config = MixtralConfig(
        vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
        num_local_experts=args.experts, num_experts_per_tok=2,
    )  # fmt: skip
    model = MixtralForCausalLM(config)
    mib = sum(t.nbytes for t in model.state_dict().values()) / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model.save_pretrained(root / "original")
        model.save_pretrained(root / "module", save_original_format=False)
        model.save_pretrained(root / "sharded", max_shard_size=f"{int(mib / 4) + 1}MB")
        shards = sorted(str(p) for p in (root / "sharded").glob("*.safetensors"))

        def ours(files: list[str]) -> Callable[[], object]:
            def run() -> object:
                m = build_without_init(lambda: MixtralForCausalLM(config), print)
                return load_weights(m, files, assign=True)

            return run

        rows = {
            "original names (converted)": ours([str(root / "original" / "model.safetensors")]),
            "module names (no conversion)": ours([str(root / "module" / "model.safetensors")]),
            f"original names, {len(shards)} shards": ours(shards),
            "from_pretrained, original names": lambda: MixtralForCausalLM.from_pretrained(
                root / "original"
            ),
        }
        print(
            f"Mixtral {mib:.0f} MiB float32 ({args.layers} layers x {args.experts} experts), "
            f"{os.cpu_count()} CPUs, {args.threads} torch thread(s), best of {args.repeat}"
        )
        base = None
        for name, fn in rows.items():
            s = best(fn, args.repeat)
            base = base or s
            print(f"  {name:34s} {s:7.3f} s  x{s / base:4.2f}")
    del torch


if __name__ == "__main__":
    main()

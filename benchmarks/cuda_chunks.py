"""CUDA tensors pushed to another process: one IPC handle per tensor (torch's own
multiprocessing sharing) against hotreload's chunks (one handle per chunk), side by side.

    .venv/bin/python benchmarks/cuda_chunks.py [--tensors 2000] [--mib 256]

Both send the same state from this process (the trainer) to a second one (the worker):
- `per-tensor`: torch.multiprocessing's reductions, one `_share_cuda_` per tensor; the
  worker opens each handle and its event, copies each tensor out, then drops them (each
  drop syncs its stream);
- `chunks`: `pack_state` (the copies into chunks on the device, one handle each) and
  `read_state` in the worker (open, copy out, drop).

Printed: the trainer's share or pack time, the worker's open, copy and release times, and
the latency of a tiny kernel + `torch.cuda.synchronize()` in the worker before the push,
while the handles are open, and after. Needs an NVIDIA GPU; without one it says so and
exits 0. Not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _sync_ms(torch: Any, x: Any, rounds: int = 50) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        x.add_(1)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _worker(conn: Any) -> None:
    import gc
    import pickle

    import torch
    import torch.multiprocessing  # its import registers the CUDA reductions pickle uses

    from hotreload.worker.pushed_state import read_state

    x = torch.ones(1, device="cuda:0")
    torch.cuda.synchronize()
    out: dict[str, float] = {"sync_before": _sync_ms(torch, x)}
    payload, descriptor = conn.recv()

    t0 = time.perf_counter()
    theirs = pickle.loads(payload)
    out["per_open"] = time.perf_counter() - t0
    out["per_sync_held"] = _sync_ms(torch, x)
    t0 = time.perf_counter()
    mine = [torch.empty_like(t).copy_(t) for t in theirs]
    torch.cuda.synchronize()
    out["per_copy"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    del theirs
    gc.collect()
    torch.cuda.synchronize()
    out["per_release"] = time.perf_counter() - t0
    out["per_sync_after"] = _sync_ms(torch, x)
    del mine

    t0 = time.perf_counter()
    state = read_state(json.loads(descriptor), "cuda:0")
    out["chunk_read"] = time.perf_counter() - t0
    out["chunk_sync_after"] = _sync_ms(torch, x)
    out["chunk_tensors"] = float(len(state))
    conn.send(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("cuda_chunks: no CUDA device here; this benchmark measures CUDA IPC (skipped)")
        return 0
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as mp

    from hotreload.protocol.shared_state import pack_state

    n = max(1, args.mib * 2**20 // 4 // args.tensors)
    state = {f"layer{i}.weight": torch.randn(n, device="cuda:0") for i in range(args.tensors)}
    torch.cuda.synchronize()
    # Packed first: torch's per-tensor sharing uses up its IPC event budget (1000), past
    # which it syncs instead of recording events; the chunks need none either way.
    t0 = time.perf_counter()
    packed = pack_state(state)
    pack_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    payload = bytes(ForkingPickler.dumps(list(state.values())))
    torch.cuda.synchronize()
    share_s = time.perf_counter() - t0

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    worker = ctx.Process(target=_worker, args=(there,), daemon=True)
    worker.start()
    try:
        here.send((payload, json.dumps(packed.descriptor)))
        if not here.poll(300):
            print("cuda_chunks: the worker gave no figures within 300 s", file=sys.stderr)
            return 1
        r = here.recv()
    finally:
        worker.join(60)
        if worker.is_alive():
            worker.kill()
        packed.close()
    total_mib = n * 4 * args.tensors / 2**20
    handles = len(packed.descriptor["chunks"])
    print(f"{args.tensors} CUDA tensors, {total_mib:.0f} MiB, on {torch.cuda.get_device_name(0)}")
    print(f"{'':24}{'per-tensor':>14}{'chunks':>14}")
    print(f"{'IPC handles':24}{args.tensors:>14}{handles:>14}")
    print(f"{'trainer: share/pack':24}{share_s * 1e3:>12.1f}ms{pack_s * 1e3:>12.1f}ms")
    per_total = r["per_open"] + r["per_copy"] + r["per_release"]
    print(
        f"{'worker: open+copy+drop':24}{per_total * 1e3:>12.1f}ms{r['chunk_read'] * 1e3:>12.1f}ms"
    )
    print(f"{'  open':24}{r['per_open'] * 1e3:>12.1f}ms")
    print(f"{'  copy out':24}{r['per_copy'] * 1e3:>12.1f}ms")
    print(f"{'  drop':24}{r['per_release'] * 1e3:>12.1f}ms")
    print(f"{'sync before the push':24}{r['sync_before']:>12.3f}ms{r['sync_before']:>12.3f}ms")
    print(f"{'sync, handles open':24}{r['per_sync_held']:>12.3f}ms{'-':>14}")
    print(f"{'sync after':24}{r['per_sync_after']:>12.3f}ms{r['chunk_sync_after']:>12.3f}ms")
    print(f"ratio worker time per-tensor / chunks: {per_total / r['chunk_read']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

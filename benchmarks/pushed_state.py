"""How fast a pushed state travels: pack (client), read (worker), digest, on the CPU.

    .venv/bin/python benchmarks/pushed_state.py [--mib 100] [--digest-mib 256] [--tensors 16]

`pack` writes a state's tensors into a sealed memfd (one pass over the bytes), `read`
copies them out into tensors the reader owns (another pass, in a second process as the
worker does), `digest` hashes a state (`worker/weights_digest.py`). Best of a few runs,
MiB/s of tensor bytes. Not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_READER = """
import json, sys, time
from hotreload.worker.pushed_state import read_state
d = json.loads(sys.argv[1])
best = 1e9
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); s = read_state(d, "cpu"); best = min(best, time.perf_counter() - t0)
    del s
print(best)
"""


def _state(mib: int, tensors: int) -> dict[str, object]:
    import torch

    n = mib * 2**20 // 4 // tensors
    return {f"layer{i}.weight": torch.randn(n) for i in range(tensors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--digest-mib", type=int, default=256)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from hotreload.protocol.shared_state import pack_state
    from hotreload.worker.weights_digest import state_digest

    state = _state(args.mib, args.tensors)
    nbytes = sum(t.nbytes for t in state.values())  # type: ignore[attr-defined]
    best = 1e9
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        pack_state(state).close()
        best = min(best, time.perf_counter() - t0)
    print(f"pack   {nbytes / 2**20:6.0f} MiB: {nbytes / best / 2**20:7.0f} MiB/s")
    with pack_state(state) as packed:
        out = subprocess.run(
            [sys.executable, "-c", _READER, json.dumps(packed.descriptor), str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
    best = float(out.stdout.strip())
    print(f"read   {nbytes / 2**20:6.0f} MiB: {nbytes / best / 2**20:7.0f} MiB/s (other process)")

    state = _state(args.digest_mib, args.tensors)
    nbytes = sum(t.nbytes for t in state.values())  # type: ignore[attr-defined]
    for threads in sorted({1, len(os.sched_getaffinity(0))}):
        best = 1e9
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            state_digest(state, threads=threads)  # type: ignore[arg-type]
            best = min(best, time.perf_counter() - t0)
        print(
            f"digest {nbytes / 2**20:6.0f} MiB: {nbytes / best / 2**20:7.0f} MiB/s "
            f"({threads} thread{'s' if threads > 1 else ''})"
        )


if __name__ == "__main__":
    main()

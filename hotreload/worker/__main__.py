"""Entry point of a worker process: `python -m hotreload.worker`.

The spec arrives in an environment variable and the control socket as an inherited file
descriptor. `env` and thread counts are applied here, before torch is imported, because
PYTORCH_CUDA_ALLOC_CONF and OMP_NUM_THREADS are read once at torch import.
"""

from __future__ import annotations

import json
import os
import sys

SPEC_ENV = "HOTRELOAD_WORKER_SPEC"
FD_ENV = "HOTRELOAD_WORKER_FD"


def main() -> int:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    fd = int(os.environ.pop(FD_ENV))
    os.environ.update(spec.get("env") or {})
    threads = spec.get("threads")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads["intra_op"]))
        os.environ.setdefault("MKL_NUM_THREADS", str(threads["intra_op"]))
    from hotreload.worker.server import run_worker  # imports torch

    return run_worker(spec, fd)


if __name__ == "__main__":
    sys.exit(main())

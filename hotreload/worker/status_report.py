"""What a worker reports about itself (the manager's `status`, the dashboard's Memory)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hotreload import runtime


def worker_status(w: Any) -> dict[str, Any]:
    """The worker's own figures: memory, allocator, versions, threads and streams."""
    mem = w.process.memory_info()
    s: dict[str, Any] = {
        "state": w.state,
        "pid": os.getpid(),
        "device": str(w.device),
        "version": w.current.version if w.current else None,
        "current": w.current.describe() if w.current else None,
        "staged": w.staged.version if w.staged else None,
        # Read while the loader thread warms it up: the manager's progress and deadline lines.
        "staged_warm_passes_ms": list(w.staged.warm_passes_ms) if w.staged else None,
        "rss_bytes": mem.rss,
        "served": w.served,
        "failed": w.failed,
        "skipped": w.skipped,
        "serving_compiles": w.serving_compiles,
        "busy_for_s": None if w.busy_since is None else time.monotonic() - w.busy_since,
        "torch": torch.__version__,
        "threads": {
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
        },
        "streams": [s.name for s in runtime.streams_for(w.current.version if w.current else None)],
    }
    if w.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(w.device)
        s["device_memory"] = {"free_bytes": int(free), "total_bytes": int(total)}
        s["allocator"] = {
            "allocated_bytes": int(torch.cuda.memory_allocated(w.device)),
            "reserved_bytes": int(torch.cuda.memory_reserved(w.device)),
            "peak_bytes": int(torch.cuda.max_memory_allocated(w.device)),
        }
    return s

"""Entry point of a worker process: `python -m hotreload.worker`.

The spec arrives in an environment variable and the control socket as an inherited file
descriptor. `env` and thread counts are applied here, before torch is imported, because
PYTORCH_CUDA_ALLOC_CONF and OMP_NUM_THREADS are read once at torch import.
"""

from __future__ import annotations

import json
import os
import sys

from hotreload.worker.launch import FD_ENV, SPEC_ENV
from hotreload.worker.oom import mark_worker


def main() -> int:
    # First: a worker, under either strategy, is the OOM killer's pick before its manager.
    mark_worker()
    spec = json.loads(os.environ.pop(SPEC_ENV))
    fd = int(os.environ.pop(FD_ENV))
    os.environ.update(spec.get("env") or {})
    threads = spec.get("threads")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads["intra_op"]))
        os.environ.setdefault("MKL_NUM_THREADS", str(threads["intra_op"]))
    boot_nice = int(spec.get("boot_nice") or 0)
    if boot_nice:
        _import_at_low_priority(boot_nice, spec.get("preimport") or [])
    from hotreload.worker.server import run_worker  # imports torch

    return run_worker(spec, fd)


def _import_at_low_priority(nice: int, libraries: list[str]) -> None:
    """A standby worker, started ahead of the next reload: its heavy imports (torch, and the
    `libraries` the serving version's build imported, such as transformers) run in a thread
    of their own at `nice`, taking only spare CPU from the worker that serves. Only that
    thread is niced (priorities are per thread): the threads that will serve keep normal
    priority, which an unprivileged process could not get back. No user module is imported
    here: the build imports the code it is given, fresh."""
    import contextlib
    import importlib
    import threading

    # Libraries that start thread pools when imported (numpy's OpenBLAS) are imported here
    # first: threads created by the idle thread would stay idle for the process's life.
    import numpy  # noqa: F401

    def boot() -> None:
        tid = threading.get_native_id()
        try:
            # SCHED_IDLE: runs only on a core nothing else wants. This thread never serves,
            # so it never needs normal scheduling back (which would need privileges).
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            with contextlib.suppress(OSError):  # not allowed here: normal priority
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        try:
            import hotreload.worker.server  # noqa: F401
        except BaseException:
            return  # the main thread's own import reports it
        for name in libraries:
            with contextlib.suppress(BaseException):  # the build imports it, and says why
                importlib.import_module(name)

    t = threading.Thread(target=boot, name="hotreload-boot")
    t.start()
    t.join()


if __name__ == "__main__":
    sys.exit(main())

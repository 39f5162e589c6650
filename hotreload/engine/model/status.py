"""What `hotreload status`, the dashboard and HTTP show for one model: read from its record
and its workers, never written."""

from __future__ import annotations

import time
from typing import Any

import psutil

from hotreload.config import ModelConfig
from hotreload.engine.model.record import ModelRecord
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.router import ModelRouter
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.messages import StatusReply, StatusRequest

#: The serving worker's own figures passed on in `status()["worker"]`.
WORKER_FIELDS = (
    "rss_bytes",
    "allocator",
    "served",
    "failed",
    "threads",
    "torch",
    "streams",
    # Requests whose forward compiled (torch.compile) on the serving path.
    "serving_compiles",
)


class WorkerFigures:
    """The serving worker's own figures (RSS, allocator), asked for at most as often as the
    caller allows: each reading costs the worker's serving thread a moment of the GIL."""

    def __init__(self) -> None:
        self.last: StatusReply | None = None
        self._at = 0.0

    async def read(
        self, worker: Worker | None, timeout_s: float = 1.0, max_age_s: float = 0.0
    ) -> StatusReply | None:
        if worker is None or not worker.alive:
            return self.last
        if max_age_s and time.monotonic() - self._at < max_age_s:
            return self.last
        try:
            self.last = await worker.status(StatusRequest(), timeout_s)
            self._at = time.monotonic()
        except (TimeoutError, WorkerDied, WorkerReplyError):
            pass
        return self.last


def model_status(
    model: ModelConfig,
    rec: ModelRecord,
    router: ModelRouter,
    workers: WorkerFactory,
    ws: StatusReply | None,
) -> dict[str, Any]:
    """The status of one model: its record, its router's figures and its serving worker's
    own (`ws`, WorkerFigures)."""
    worker, current = rec.serving, rec.current
    limit = worker.memory_limit() if worker else None
    cpus = workers.cpus
    return {
        "name": model.name,
        "state": rec.state,
        "version": rec.version,
        "device": (worker.device if worker else None) or model.device,
        "policy": model.policy,
        "strategy": model.strategy,
        "pid": worker.pid if worker else None,
        "restarts": rec.restarts,
        "last_error": rec.last_error,
        "load_s": current.load_s if current else None,
        "warm_s": current.warm_s if current else None,
        "warm_passes_ms": current.warm_passes_ms if current else [],
        "outputs": current.outputs if current else [],
        # The serving weights' content digest, and the pushes laid over the files' weights.
        "digest": current.digest if current else None,
        "pushes": len(current.overlays) if current else 0,
        # peft adapters: the default, the base's digest and each adapter's (None: none).
        "adapters": current.adapters if current else None,
        # torch.compile in the serving version's warm phase (None: an eager model), and
        # the served signatures its next build's warm phase replays.
        "compile": current.compile if current else None,
        "served_shapes": len(router.served),
        # How the serving version's golden outputs differ from the version it replaced
        # (engine/golden.py `compare`; None: nothing compared, a first version or a restart).
        "golden": current.golden_diff if current else None,
        # The serving version's eval (engine/model/evals.py): figures or its error.
        "eval": current.eval if current else None,
        # What `hotreload rollback` can serve again (engine/model/kept_versions.py).
        "kept_versions": [k.version for k in rec.kept],
        "inputs": router.input_signature,
        "input_form": router.input_form,
        **router.snapshot(),
        "worker": {
            k: getattr(ws, k) for k in WORKER_FIELDS if getattr(ws, k, None) is not None
        },
        "standby": standby_status(rec.standby),
        # The cgroup memory limit the serving worker runs under (None: no limit).
        "memory_limit_bytes": limit.limit_bytes if limit else None,
        # Where the serving worker runs, and everything else (None: not pinned).
        "cpus": None
        if cpus is None
        else {"serving": sorted(cpus), "rest": sorted(workers.cpus_rest)},
    }


def standby_status(worker: Worker | None) -> dict[str, Any] | None:
    """The idle worker waiting for the next reload (strategy respawn): one more process
    holding memory, so it shows. Read from outside: asking it would wake it up."""
    if worker is None or not worker.alive or worker.pid is None:
        return None
    try:
        rss = psutil.Process(worker.pid).memory_info().rss
    except psutil.Error:
        rss = None
    return {"pid": worker.pid, "rss_bytes": rss, "reuses": worker.recycled}

"""Strategy `inplace`: the new version is built in the serving worker itself.

The supervisor runs the reload (supervisor.py `_reload`); this strategy says where the
version is built and what becomes of the old one:

availability (load before unload):
    build in the serving worker -> the worker's in-band swap (drain, sync) -> release
resource (unload first, for models that cannot co-reside):
    gate -> drain -> sync -> offload -> build in the serving worker -> swap -> resume
"""

from __future__ import annotations

import contextlib

from hotreload.engine.model import phases
from hotreload.engine.model.built import Built, Retired
from hotreload.engine.model.jobs import PhaseFailed
from hotreload.engine.model.phases import BuildSpec, RunPhase
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.worker_port import Worker
from hotreload.protocol.messages import ReleaseRequest, SwapRequest


class InPlace:
    name = "inplace"
    #: No worker is started ahead of time.
    wants_standby = False

    def __init__(self, workers: WorkerFactory) -> None:
        self.workers = workers

    async def build(self, run: RunPhase, spec: BuildSpec, standby: Worker | None = None) -> Built:
        worker = spec.serving
        if worker is None or not worker.alive:
            # No worker serves (a failed start, an unload): start one and build on it.
            new, info = await phases.bring_up(run, self.workers, spec)
            return Built(new, info, swapped=True)
        try:
            info = await phases.build(run, worker, spec)
        except PhaseFailed:
            with contextlib.suppress(Exception):
                await worker.release(ReleaseRequest("staged"), 30.0)
            raise
        return Built(worker, info, swapped=False)

    async def switch(self, built: Built) -> None:
        """Behind a closed gate (resource policy): the staged version becomes the serving
        one, and the offloaded old one is freed."""
        if not built.swapped:
            await built.worker.swap(SwapRequest(), 30.0)
            stop_s = self.workers.model.deadlines.stop_s
            await built.worker.release(ReleaseRequest("retired"), stop_s)

    async def retire(self, old: Worker, gone: str | None, keep: bool) -> Retired:
        """The old version lived in the serving worker: free it there."""
        stop_s = self.workers.model.deadlines.stop_s
        return Retired((await phases.release(old, "retired", stop_s)).detail)

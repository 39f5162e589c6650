"""Strategy `inplace`: the new version is built in the serving worker itself.

availability (load before unload):
    load -> warm -> smoke (old version keeps serving) -> gate -> drain -> sync -> swap
    -> release
resource (unload first, for models that cannot co-reside):
    gate -> drain -> sync -> release (offload the old version, kept to restore) -> load
    -> warm -> smoke -> swap -> resume
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from hotreload.engine.model import phases
from hotreload.engine.model.jobs import PhaseFailed, ReloadJob, Wedged
from hotreload.engine.model.phases import MIB, PhaseRunner
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.snapshots import code_paths
from hotreload.engine.worker_proc import WorkerOp, WorkerProcess, WorkerReplyError

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor


class InPlace:
    name = "inplace"

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    async def reload(self, runner: PhaseRunner, job: ReloadJob, policy: str) -> None:
        sup = self.sup
        worker = sup.record.serving
        assert worker is not None
        version = sup.record.next_version
        fields = {
            # A push runs the serving code again: nothing to re-import or point at.
            "code": None if job.push else code_paths(sup.model, sup.config.root),
            "reimport": not job.weights_only and job.push is None,
        }
        if policy == "availability":
            try:
                info = await phases.build(runner, worker, version, job=job, **fields)
            except PhaseFailed:
                with contextlib.suppress(Exception):
                    await worker.request(WorkerOp.RELEASE, 30.0, which="staged")
                raise
            await self._inband_swap(runner, worker, info)

            async def release() -> dict[str, Any]:
                r = await worker.request(
                    WorkerOp.RELEASE, sup.model.deadlines.stop_s, which="retired"
                )
                return {"detail": f"freed {r.get('freed_bytes', 0) / MIB:.1f} MiB of device memory"}

            await runner.run("release", release)
            return
        await phases.gate_drain_sync(runner, worker)
        await phases.offload_old(runner, worker)
        try:
            info = await phases.build(runner, worker, version, job=job, **fields)
        except PhaseFailed:
            await phases.restore_old(sup, worker)  # the error is still reported
            raise

        async def swap() -> None:
            await worker.request(WorkerOp.SWAP, 30.0)
            await worker.request(WorkerOp.RELEASE, sup.model.deadlines.stop_s, which="retired")
            sup.install(worker, info, announce=False, open_gate=False)

        await runner.run("swap", swap)
        await phases.resume(runner)

    async def _inband_swap(
        self, runner: PhaseRunner, worker: WorkerProcess, info: VersionInfo
    ) -> None:
        """gate, drain, sync and swap without pausing admission.

        The swap goes to the worker's serving thread behind the requests already sent: when
        it runs, they have all finished (the drain); the thread then polls the old
        version's streams to the sync deadline and switches. New requests keep flowing to
        the worker meanwhile and queue behind the swap, so serving never stops.
        """
        sup = self.sup
        router, d = sup.router, sup.model.deadlines
        reply: dict[str, Any] = {}

        async def gate() -> dict[str, Any]:
            return {"skipped": True, "reason": "in-band swap: admission stays open"}

        async def drain() -> dict[str, Any]:
            n = router.inflight
            try:
                reply.update(
                    await asyncio.wait_for(
                        worker.request(WorkerOp.SWAP, None, inband=True, sync_deadline_s=d.sync_s),
                        d.drain_wait_s + d.sync_s,
                    )
                )
            except TimeoutError:
                raise Wedged(
                    "drain",
                    "requests sent before the swap still running after the "
                    f"{d.drain_wait_s:g} s drain deadline: a forward is hung",
                ) from None
            except WorkerReplyError as exc:
                if exc.code == "streams_busy":
                    raise Wedged("sync", str(exc)) from None
                raise
            return {"detail": f"{n} request(s) in flight finished before the swap"}

        async def sync() -> dict[str, Any]:
            s = reply.get("sync") or {}
            if s.get("skipped"):
                return {"skipped": True, "reason": s.get("reason")}
            n, ms = len(s.get("streams", [])), s.get("waited_s", 0.0) * 1000
            return {"detail": f"{n} stream(s) idle after {ms:.1f} ms (polled by the worker)"}

        async def swap() -> None:
            sup.install(worker, info, announce=False, open_gate=False)

        await runner.run("gate", gate)
        await runner.run("drain", drain)
        await runner.run("sync", sync)
        await runner.run("swap", swap)

    async def new_worker(
        self, runner: PhaseRunner, job: ReloadJob, version: int
    ) -> tuple[WorkerProcess, VersionInfo]:
        """No worker serves (a failed start, an unload): start one and build on it."""
        sup = self.sup
        return await phases.bring_up(
            runner, version, code=code_paths(sup.model, sup.config.root), mode="cold", job=job
        )

    async def after_job(self) -> None:
        """Nothing to prepare between reloads."""

    async def close(self) -> None:
        """Nothing of its own to stop."""

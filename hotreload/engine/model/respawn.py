"""Strategy `respawn`: the new version is built in another worker process.

By default that process was started ahead of time (the standby), so a reload pays for
neither a process start nor torch's import, and the build shares neither the serving
process's GIL nor its thread pools. Once it is built, warm and smoke-tested, the new worker
takes over at once while the old one finishes its requests (the hand-over); the old one,
its streams synced idle, then becomes the next standby (`recycle` times per process). A load
that fails in such a reused worker is tried once in a fresh process, because code with a
one-time effect per process fails a second import in the same interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from hotreload.engine.model import phases
from hotreload.engine.model.jobs import PhaseFailed, ReloadJob, Wedged
from hotreload.engine.model.phases import PhaseRunner
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.snapshots import code_paths
from hotreload.engine.worker_proc import WorkerDied, WorkerOp, WorkerProcess, WorkerReplyError

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor

#: Errors that come out the same in any process: a broken file, not a reused interpreter.
DETERMINISTIC_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError", "LoadError"})


class Respawn:
    name = "respawn"

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        #: Starting the next standby worker in the background.
        self._standby_task: asyncio.Task[None] | None = None
        #: Why workers are no longer reused for this model (None: they are).
        self.recycle_off: str | None = None
        self._closed = False

    # ------------------------------------------------------------------ standby worker

    async def after_job(self) -> None:
        """Start the next worker ahead of time, in the background, after a job: its start
        never competes with a build."""
        sup = self.sup
        if (
            self._closed
            or not sup.model.standby
            or sup.record.standby is not None
            or (self._standby_task is not None and not self._standby_task.done())
        ):
            return
        self._standby_task = asyncio.create_task(self._start_standby(), name=f"standby-{sup.name}")

    async def _start_standby(self) -> None:
        sup = self.sup
        try:
            worker = await sup.spawn(code_paths(sup.model, sup.config.root), standby=True)
        except Exception as exc:
            # Not fatal: the next reload spawns a worker as if there were no standby.
            sup.events.emit("standby_failed", model=sup.name, error=str(exc))
            return
        if self._closed:
            await worker.kill()
            return
        sup.keep_standby(worker)

    async def _recycle(self, old: WorkerProcess, *, after: str = "serving") -> str | None:
        """The worker just retired (its streams synced idle, nothing in flight), or a standby
        whose build failed in the user's code, drops its versions and becomes the next
        standby: the next reload then pays for neither a process start nor torch's import,
        which would compete with serving for ~2 s of CPU. Up to `recycle` times per process;
        None means stop it instead."""
        sup = self.sup
        model = sup.model
        if (
            self._closed
            or self.recycle_off is not None
            or not model.standby
            or old.recycled >= model.recycle
            or sup.record.standby is not None
            or not old.alive
        ):
            return None
        try:
            r = await old.request(WorkerOp.RETIRE, model.deadlines.stop_s)
        except (WorkerDied, WorkerReplyError, TimeoutError):
            return None  # not fit to keep: the caller stops it
        await self._cancel_standby_start()  # a fresh one still importing is not needed now
        if self._closed or sup.record.standby is not None:
            return None
        old.recycled += 1
        sup.keep_standby(old, recycled=old.recycled, after=after)
        freed = int(r.get("freed_bytes") or 0)
        what = "old worker" if after == "serving" else "worker"
        return (
            f"{what} pid {old.pid} kept as the next standby after {after} (reuse "
            f"{old.recycled} of {model.recycle}), its versions dropped"
            + (f" ({freed / (1024 * 1024):.0f} MiB of device memory freed)" if freed else "")
        )

    def _disable_recycle(self, reason: str) -> None:
        if self.recycle_off is None:
            self.recycle_off = reason
            self.sup.events.emit("recycle_disabled", model=self.sup.name, reason=reason)

    async def _cancel_standby_start(self) -> None:
        task = self._standby_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        """Session shutdown: no new standby, and the one waiting is stopped."""
        self._closed = True
        await self._cancel_standby_start()
        worker = self.sup.take_standby()
        if worker is not None:
            await worker.stop(self.sup.model.deadlines.stop_s)

    # ------------------------------------------------------------------ building

    async def _keep_after_failed_build(self, worker: WorkerProcess, exc: BaseException) -> bool:
        """A fresh standby whose build raised in the user's code (a broken save: it answered
        with the error) stays the standby, so the fixed save reloads as fast as ever. On the
        CPU only: an exception there leaves the process as it was, while a CUDA error can
        poison the context for good. A reused worker goes unless the error is one any process
        would raise (a syntax error): its failure may be the reuse itself (see `new_worker`).
        A build past its deadline, or a worker that died, goes too."""
        if not (
            isinstance(exc, PhaseFailed)
            and isinstance(exc.__cause__, WorkerReplyError)
            and exc.phase in ("load", "warm", "smoke")
            and worker.device == "cpu"
            and (worker.recycled == 0 or not _may_be_reuse(exc))
            and worker.alive
        ):
            return False
        return await self._recycle(worker, after="a failed build") is not None

    async def new_worker(
        self, runner: PhaseRunner, job: ReloadJob, version: int
    ) -> tuple[WorkerProcess, VersionInfo]:
        """A worker (the standby if there is one) with `version` built, warm, smoke-tested
        and swapped in on its side. A build that fails to import in a reused worker is tried
        once more in a fresh process: code with a one-time effect per process (a
        `TORCH_LIBRARY` definition, a metrics registry) fails the second time it is imported
        in the same interpreter, and that must not read as the user's edit being broken."""
        cold = self.sup.record.serving is None or not self.sup.record.serving.alive
        worker = await self._spawn_phase(runner, fresh=False)
        try:
            return worker, await self._build(runner, worker, job, version, cold=cold)
        except PhaseFailed as exc:
            if not (worker.recycled and exc.phase == "load" and _may_be_reuse(exc)):
                raise
            first = exc
        worker = await self._spawn_phase(runner, fresh=True)
        info = await self._build(runner, worker, job, version, cold=cold)
        why = (
            f"v{version} failed to import in a reused worker ({first}) and built in a fresh "
            "one: this code does not survive a second import in one process"
        )
        assert runner.outcome is not None
        runner.outcome.detail.append(why + "; workers are no longer reused for this model")
        self._disable_recycle(why)
        return worker, info

    async def _spawn_phase(self, runner: PhaseRunner, *, fresh: bool) -> WorkerProcess:
        sup = self.sup
        box: list[WorkerProcess] = []

        async def spawn() -> dict[str, Any]:
            standby = None if fresh else await self._take_standby()
            if standby is not None:
                box.append(standby)
                how = (
                    f"recycled after serving (reuse {standby.recycled})"
                    if standby.recycled
                    else "started ahead of time"
                )
                return {"detail": f"standby worker pid {standby.pid}, {how}"}
            box.append(await sup.spawn(code_paths(sup.model, sup.config.root)))
            again = ", a fresh process after the reused one failed" if fresh else ""
            return {"detail": f"worker pid {box[0].pid}{again}"}

        name = "fresh_spawn" if fresh else "spawn"
        try:
            await runner.run(name, spawn, deadline_s=sup.model.deadlines.start_s)
        except BaseException:
            if box:
                await box[0].kill()  # failed, or cancelled (shutdown): the new worker goes
            raise
        return box[0]

    async def _take_standby(self) -> WorkerProcess | None:
        """The standby worker for this reload, or None. One still starting (at low priority)
        is left for the next reload: a fresh spawn at normal priority is quicker now."""
        worker = self.sup.take_standby()
        if worker is None:
            return None
        if not worker.alive:
            await worker.kill()
            return None
        self.sup.adopt(worker)
        return worker

    async def _build(
        self,
        runner: PhaseRunner,
        worker: WorkerProcess,
        job: ReloadJob,
        version: int,
        *,
        cold: bool,
    ) -> VersionInfo:
        """load, warm, smoke and the worker's own swap; on failure the worker is stopped (or
        kept as the standby, see `_keep_after_failed_build`)."""
        sup = self.sup
        try:
            info = await phases.build(
                runner,
                worker,
                version,
                code=code_paths(sup.model, sup.config.root),
                # A recycled standby still holds the code of the version before last:
                # re-import even for a weights-only change.
                reimport=not job.weights_only or worker.recycled > 0,
                mode="cold" if cold else "reload",
                job=job,
            )
            await phases.own_swap(worker)
        except PhaseFailed as exc:
            keep = False
            try:
                keep = await self._keep_after_failed_build(worker, exc)
            finally:
                # Also when cancelled while deciding: never leave the process behind.
                if not keep and sup.record.standby is not worker:
                    await worker.kill()
            raise
        except Exception as exc:
            await worker.kill()
            raise PhaseFailed("load", str(exc)) from exc
        except BaseException:
            await worker.kill()  # cancelled (shutdown): the new worker goes too
            raise
        return info

    # ------------------------------------------------------------------ the reload

    async def reload(self, runner: PhaseRunner, job: ReloadJob, policy: str) -> None:
        sup = self.sup
        old = sup.record.serving
        assert old is not None
        version = sup.record.next_version
        if policy != "resource":
            new, info = await self.new_worker(runner, job, version)
            await self._handover(runner, old, new, info)
            return
        await phases.gate_drain_sync(runner, old)
        await phases.offload_old(runner, old)
        try:
            new, info = await self.new_worker(runner, job, version)
        except PhaseFailed:
            await phases.restore_old(sup, old)
            raise

        async def swap() -> None:
            sup.install(new, info, announce=False, open_gate=False)  # opened by resume

        async with self._retiring(old):
            await runner.run("swap", swap)
            await phases.resume(runner)
            await self._release_old(runner, old, None)

    async def _handover(
        self, runner: PhaseRunner, old: WorkerProcess, new: WorkerProcess, info: VersionInfo
    ) -> None:
        """Two processes, both versions resident: the new worker takes requests at once and
        the old one finishes its own in flight, then has its streams synced to the deadline
        and is released. No request waits behind a closed gate, and nothing rolls back: the
        new version is built, warm and smoke-tested, and a drain or sync that fails only
        means the old worker is killed (its requests are retried on the new one)."""
        sup = self.sup
        router, d = sup.router, sup.model.deadlines

        async def swap() -> dict[str, Any]:
            sup.install(new, info, announce=False, handover=True)
            return {
                "detail": f"new requests go to worker pid {new.pid}; "
                f"{router.draining} still in flight on pid {old.pid}"
            }

        async def drain() -> dict[str, Any]:
            n = router.draining
            if not await router.drain_previous(d.drain_wait_s):
                raise Wedged(
                    "drain",
                    f"{router.draining} request(s) still running on the old worker after "
                    f"the {d.drain_wait_s:g} s drain deadline: a forward is hung",
                )
            return {"detail": f"{n} request(s) finished on the old worker"}

        async with self._retiring(old):
            await runner.run("swap", swap)
            old_gone: str | None = None
            try:
                await runner.run("drain", drain)
                # Its requests done on the serving CPUs (moved now, they would wait for a
                # CPU behind the session's own work): the rest of its life is reload work.
                sup.workers.place(old, serving=False)
                await runner.run("sync", lambda: phases.sync_streams(sup, old))
            except PhaseFailed as exc:
                old_gone = "wedged" if isinstance(exc, Wedged) else "failed"
                if not old.alive:
                    old_gone = "died"
                sup.events.emit(
                    "wedged" if old_gone == "wedged" else "worker_lost",
                    model=sup.name,
                    phase=exc.phase,
                    detail=f"{exc}; old worker abandoned",
                )
                assert runner.outcome is not None
                runner.outcome.detail.append(f"old worker {old_gone} in {exc.phase}: abandoned")
            await self._release_old(runner, old, old_gone)

    @contextlib.asynccontextmanager
    async def _retiring(self, old: WorkerProcess) -> AsyncIterator[None]:
        """From the swap on, the old worker is neither the serving one nor the standby: if
        the reload stops here (cancelled at shutdown, a bug of ours), stop it with it."""
        sup = self.sup
        sup.mark_retiring(old)
        try:
            yield
        except BaseException:
            if sup.record.standby is not old:
                await old.kill()
            raise
        finally:
            sup.mark_retiring(None)

    async def _release_old(
        self, runner: PhaseRunner, old: WorkerProcess, old_gone: str | None
    ) -> None:
        async def release() -> dict[str, Any]:
            # In-flight requests of a killed old worker are retried on the new one.
            if old_gone:
                await old.kill()
                return {"detail": f"old worker pid {old.pid} killed ({old_gone})"}
            kept = await self._recycle(old)
            if kept is not None:
                return {"detail": kept}
            await old.stop(self.sup.model.deadlines.stop_s)
            return {"detail": f"old worker pid {old.pid} stopped"}

        await runner.run("release", release)


def _may_be_reuse(exc: PhaseFailed) -> bool:
    """Could this load failure come from importing the code a second time in one process?"""
    cause = exc.__cause__
    return isinstance(cause, WorkerReplyError) and cause.error_type not in DETERMINISTIC_ERRORS

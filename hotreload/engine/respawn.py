"""Strategy `respawn`: the new version is built in another worker process.

By default that process was started ahead of time (the standby), so a reload pays for
neither a process start nor torch's import, and the build shares neither the serving
process's GIL nor its thread pools. Once it is built, warm and smoke-tested, the new worker
takes over at once while the old one finishes its requests (the hand-over); the old one,
its streams synced idle, then becomes the next standby (`recycle` times per process). A load
that fails in such a reused worker is tried once in a fresh process, because code with a
one-time effect per process fails a second import in the same interpreter.

A mixin of `Reloader`, on top of the phases every strategy shares (reload_phases.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from hotreload.engine.host import VersionInfo
from hotreload.engine.reload_outcome import PhaseFailed, ReloadJob, ReloadOutcome, Wedged
from hotreload.engine.reload_phases import ReloadPhases
from hotreload.engine.snapshots import Snapshot, code_paths
from hotreload.engine.worker_proc import WorkerDied, WorkerOp, WorkerProcess, WorkerReplyError


class RespawnPhases(ReloadPhases):
    """The standby worker's life and the respawn strategy's phases."""

    _closed: bool
    #: Starting the next standby worker (`standby = true`).
    _standby_task: asyncio.Task[None] | None
    #: Why workers are no longer reused for this model (None: they are, see `_recycle`).
    recycle_off: str | None

    # ------------------------------------------------------------------ standby worker

    def _ensure_standby(self) -> None:
        """Start the next worker ahead of time, in the background (strategy "respawn")."""
        host = self.host
        if (
            self._closed
            or host.model.strategy != "respawn"
            or not host.model.standby
            or host.standby is not None
            or (self._standby_task is not None and not self._standby_task.done())
        ):
            return
        self._standby_task = asyncio.create_task(self._start_standby(), name=f"standby-{host.name}")

    async def _start_standby(self) -> None:
        host = self.host
        try:
            worker = await host.spawn_worker(code_paths(host.model, host.config.root), standby=True)
        except Exception as exc:
            # Not fatal: the next reload spawns a worker as if there were no standby.
            self.events.emit("standby_failed", model=host.name, error=str(exc))
            return
        if self._closed:
            await worker.kill()
            return
        host.standby = worker

    async def _take_standby(self) -> WorkerProcess | None:
        """The standby worker for this reload, or None. One still starting (at low priority)
        is left for the next reload: a fresh spawn at normal priority is quicker now."""
        host = self.host
        worker, host.standby = host.standby, None
        if worker is None:
            return None
        if not worker.alive:
            await worker.kill()
            return None
        host.adopt(worker)
        return worker

    async def _recycle(self, old: WorkerProcess, *, after: str = "serving") -> str | None:
        """The worker just retired (its streams synced idle, nothing in flight), or a standby
        whose build failed in the user's code, drops its versions and becomes the next
        standby: the next reload then pays for neither a process start nor torch's import,
        which would compete with serving for ~2 s of CPU. Up to `recycle` times per process;
        None means stop it instead."""
        host = self.host
        model = host.model
        if (
            self._closed
            or self.recycle_off is not None
            or model.strategy != "respawn"
            or not model.standby
            or old.recycled >= model.recycle
            or host.standby is not None
            or not old.alive
        ):
            return None
        try:
            r = await old.request(WorkerOp.RETIRE, model.deadlines.stop_s)
        except (WorkerDied, WorkerReplyError, TimeoutError):
            return None  # not fit to keep: the caller stops it
        await self._cancel_standby_start()  # a fresh one still importing is not needed now
        if self._closed or host.standby is not None:
            return None
        old.recycled += 1
        host.standby = old
        self.events.emit(
            "standby_ready", model=host.name, pid=old.pid, recycled=old.recycled, after=after
        )
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
            self.events.emit("recycle_disabled", model=self.host.name, reason=reason)

    async def _cancel_standby_start(self) -> None:
        task = self._standby_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _drop_standby(self) -> None:
        await self._cancel_standby_start()
        worker, self.host.standby = self.host.standby, None
        if worker is not None:
            await worker.stop(self.host.model.deadlines.stop_s)

    # ------------------------------------------------------------------ phases

    async def _keep_after_failed_build(self, worker: WorkerProcess, exc: BaseException) -> bool:
        """A fresh standby whose build raised in the user's code (a broken save: it answered
        with the error) stays the standby, so the fixed save reloads as fast as ever. On the
        CPU only: an exception there leaves the process as it was, while a CUDA error can
        poison the context for good. A reused worker goes unless the error is one any process
        would raise (a syntax error): its failure may be the reuse itself (see
        `_spawn_and_build`). A build past its deadline, or a worker that died, goes too."""
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

    async def _spawn_and_build(
        self, job: ReloadJob, outcome: ReloadOutcome, version: int, *, cold: bool
    ) -> tuple[WorkerProcess, VersionInfo]:
        """A worker (the standby if there is one) with `version` built, warm, smoke-tested
        and swapped in on its side. A build that fails to import in a reused worker is tried
        once more in a fresh process: code with a one-time effect per process (a
        `TORCH_LIBRARY` definition, a metrics registry) fails the second time it is imported
        in the same interpreter, and that must not read as the user's edit being broken."""
        worker = await self._spawn_phase(outcome, fresh=False)
        try:
            return worker, await self._build(worker, job, outcome, version, cold=cold)
        except PhaseFailed as exc:
            if not (worker.recycled and exc.phase == "load" and _may_be_reuse(exc)):
                raise
            first = exc
        worker = await self._spawn_phase(outcome, fresh=True)
        info = await self._build(worker, job, outcome, version, cold=cold)
        why = (
            f"v{version} failed to import in a reused worker ({first}) and built in a fresh "
            "one: this code does not survive a second import in one process"
        )
        outcome.detail.append(why + "; workers are no longer reused for this model")
        self._disable_recycle(why)
        return worker, info

    async def _spawn_phase(self, outcome: ReloadOutcome, *, fresh: bool) -> WorkerProcess:
        host = self.host
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
            worker = await host.spawn_worker(code_paths(host.model, host.config.root))
            box.append(worker)
            again = ", a fresh process after the reused one failed" if fresh else ""
            return {"detail": f"worker pid {worker.pid}{again}"}

        name = "fresh_spawn" if fresh else "spawn"
        try:
            await self._phase(name, outcome, spawn, deadline_s=host.model.deadlines.start_s)
        except PhaseFailed:
            raise
        except Exception as exc:
            if box:
                await box[0].kill()
            raise PhaseFailed(name, str(exc)) from exc
        except BaseException:
            if box:
                await box[0].kill()  # cancelled (shutdown): the new worker goes too
            raise
        return box[0]

    async def _build(
        self,
        worker: WorkerProcess,
        job: ReloadJob,
        outcome: ReloadOutcome,
        version: int,
        *,
        cold: bool,
    ) -> VersionInfo:
        """load, warm, smoke and the worker's own swap; on failure the worker is stopped (or
        kept as the standby, see `_keep_after_failed_build`)."""
        try:
            info = await self._load_warm_smoke(worker, version, job, outcome, cold=cold)
            await worker.request(WorkerOp.SWAP, 30.0)  # the new worker's own staged -> current
        except (PhaseFailed, WorkerReplyError, WorkerDied, TimeoutError) as exc:
            keep = False
            try:
                keep = await self._keep_after_failed_build(worker, exc)
            finally:
                # Also when cancelled while deciding: never leave the process behind.
                if not keep and self.host.standby is not worker:
                    await worker.kill()
            if isinstance(exc, PhaseFailed):
                raise
            raise PhaseFailed("swap", f"new worker failed to switch: {exc}") from exc
        except Exception as exc:
            await worker.kill()
            raise PhaseFailed("load", str(exc)) from exc
        except BaseException:
            await worker.kill()  # cancelled (shutdown): the new worker goes too
            raise
        return info

    async def _respawn(
        self, job: ReloadJob, outcome: ReloadOutcome, candidate: Snapshot | None
    ) -> None:
        host = self.host
        old = host.worker
        assert old is not None
        version = host.next_version
        if outcome.policy != "resource":
            new, info = await self._spawn_and_build(job, outcome, version, cold=False)
            await self._handover(old, new, info, outcome)
            return
        await self._gate_drain_sync(old, outcome)
        await self._offload_old(old, outcome)
        try:
            new, info = await self._spawn_and_build(job, outcome, version, cold=False)
        except PhaseFailed:
            await self._restore_old(old)
            raise

        async def swap() -> None:
            host._install(new, info, announce=False)
            host.router.close_gate()  # reopened by resume

        async with self._retiring(old):
            await self._phase("swap", outcome, swap)
            await self._resume(outcome)
            await self._release_old(old, outcome, None)

    async def _handover(
        self, old: WorkerProcess, new: WorkerProcess, info: VersionInfo, outcome: ReloadOutcome
    ) -> None:
        """Two processes, both versions resident: the new worker takes requests at once and
        the old one finishes its own in flight, then has its streams synced to the deadline
        and is released. No request waits behind a closed gate, and nothing rolls back: the
        new version is built, warm and smoke-tested, and a drain or sync that fails only
        means the old worker is killed (its requests are retried on the new one)."""
        host, d = self.host, self.host.model.deadlines

        async def swap() -> dict[str, Any]:
            host._install(new, info, announce=False, handover=True)
            return {
                "detail": f"new requests go to worker pid {new.pid}; "
                f"{host.router.draining} still in flight on pid {old.pid}"
            }

        async def drain() -> dict[str, Any]:
            n = host.router.draining
            if not await host.router.drain_previous(d.drain_wait_s):
                raise Wedged(
                    "drain",
                    f"{host.router.draining} request(s) still running on the old worker after "
                    f"the {d.drain_wait_s:g} s drain deadline: a forward is hung",
                )
            return {"detail": f"{n} request(s) finished on the old worker"}

        async with self._retiring(old):
            await self._phase("swap", outcome, swap)
            old_gone: str | None = None
            try:
                await self._phase("drain", outcome, drain)
                # Its requests done on the serving CPUs (moved now, they would wait for a
                # CPU behind the session's own work): the rest of its life is reload work.
                host.place(old, serving=False)
                await self._phase("sync", outcome, lambda: self._sync_streams(old))
            except PhaseFailed as exc:
                old_gone = "wedged" if isinstance(exc, Wedged) else "failed"
                if not old.alive:
                    old_gone = "died"
                self.events.emit(
                    "wedged" if old_gone == "wedged" else "worker_lost",
                    model=host.name,
                    phase=exc.phase,
                    detail=f"{exc}; old worker abandoned",
                )
                outcome.detail.append(f"old worker {old_gone} in {exc.phase}: abandoned")
            await self._release_old(old, outcome, old_gone)

    @contextlib.asynccontextmanager
    async def _retiring(self, old: WorkerProcess) -> AsyncIterator[None]:
        """From the swap on, the old worker is neither the serving one nor the standby: if
        the reload stops here (cancelled at shutdown, a bug of ours), stop it with it."""
        host = self.host
        host.retiring = old
        try:
            yield
        except BaseException:
            if host.standby is not old:
                await old.kill()
            raise
        finally:
            host.retiring = None

    async def _release_old(
        self, old: WorkerProcess, outcome: ReloadOutcome, old_gone: str | None
    ) -> None:
        host = self.host

        async def release() -> dict[str, Any]:
            # In-flight requests of a killed old worker are retried on the new one.
            if old_gone:
                await old.kill()
                return {"detail": f"old worker pid {old.pid} killed ({old_gone})"}
            kept = await self._recycle(old)
            if kept is not None:
                return {"detail": kept}
            await old.stop(host.model.deadlines.stop_s)
            return {"detail": f"old worker pid {old.pid} stopped"}

        await self._phase("release", outcome, release)

    async def _cold_start(
        self, job: ReloadJob, outcome: ReloadOutcome, candidate: Snapshot | None
    ) -> None:
        """No live worker (first start failed, unloaded, or restarts gave up): start one."""
        host = self.host
        version = host.next_version
        if host.worker is not None and not host.worker.alive:
            await host.worker.kill()
        new, info = await self._spawn_and_build(job, outcome, version, cold=True)
        host._install(new, info, announce=False)
        host.ensure_watchdog()


#: Errors that come out the same in any process: a broken file, not a reused interpreter.
DETERMINISTIC_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError", "LoadError"})


def _may_be_reuse(exc: PhaseFailed) -> bool:
    """Could this load failure come from importing the code a second time in one process?"""
    cause = exc.__cause__
    return isinstance(cause, WorkerReplyError) and cause.error_type not in DETERMINISTIC_ERRORS

"""One supervisor per served model: the only owner of its workers and its state.

Everything that changes which worker serves, or which version, is a job (jobs.py) run one
at a time by the supervisor's loop, under the device lock for the jobs that build:

    start     spawn -> load -> warm -> smoke -> serve       (the model's first worker)
    reload    policy -> snapshot -> the strategy's phases    (inplace.py, respawn.py)
    restart   kill -> [GPU reset] -> spawn -> load -> warm -> smoke -> serve, on the last
              good snapshot (a worker died, or a forward hung past its deadline)
    unload    gate -> drain -> stop the worker
    stop      the session ends: the running job is cancelled, queued ones never run

A worker that dies queues a restart; so does the watchdog for a forward stuck past
`forward_s`. Because jobs run one at a time, a restart can never race a reload for the
worker: it runs after the reload, and does nothing if the reload already replaced the
worker. A failed build leaves the old version serving.

The state record (record.py) is written here only; the strategies and phases ask for each
change through the methods in "state changes" below.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import lifecycle, pushes, recovery, reload_job
from hotreload.engine.model.inplace import InPlace
from hotreload.engine.model.jobs import (
    Job,
    JobQueue,
    ReloadJob,
    ReloadOutcome,
    RestartJob,
    StartJob,
    UnloadJob,
)
from hotreload.engine.model.pushes import Overlay
from hotreload.engine.model.record import ModelRecord, VersionInfo
from hotreload.engine.model.respawn import Respawn
from hotreload.engine.model.status import WorkerFigures, model_status
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.router import ModelRouter
from hotreload.engine.signature import describe_dynamic
from hotreload.engine.snapshots import Snapshot
from hotreload.engine.worker_proc import WorkerProcess
from hotreload.errors import ReloadFailedError, WorkerUnavailableError


class ModelSupervisor:
    def __init__(
        self,
        model: ModelConfig,
        config: Config,
        events: EventBus,
        locks: DeviceLocks,
        *,
        ignore: IgnoreRules | None = None,
        snapshot_dir: Path | None = None,
        workers: WorkerFactory | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.events = events
        self.locks = locks
        self.ignore = ignore or IgnoreRules()
        self.snapshot_dir = snapshot_dir
        self.router = ModelRouter(
            name=model.name,
            max_queue_size=model.max_queue_size,
            request_timeout_s=model.request_timeout_s,
            max_inflight=model.max_inflight,
        )
        self.record = ModelRecord()
        self.workers = workers or WorkerFactory(model, config)
        self.workers.on_pin_failed = self._pin_failed
        #: Pushed weights build in the serving worker whatever the strategy.
        self.inplace = InPlace(self)
        self.strategy: InPlace | Respawn = (
            Respawn(self) if model.strategy == "respawn" else self.inplace
        )
        self._pushes = 0
        #: Called after a wedged worker was killed, before its replacement starts (the
        #: session's GPU reset, where `[gpu] reset` allows one).
        self.escalate: Callable[[ModelSupervisor], Awaitable[None]] | None = None
        #: The weights-override warning was given (once per session).
        self.override_warned = False
        self._figures = WorkerFigures()
        self._queue = JobQueue()
        self._running: Job | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._job_task: asyncio.Task[Any] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ read-only views

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def worker(self) -> WorkerProcess | None:
        return self.record.serving

    @property
    def state(self) -> str:
        return self.record.state

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def current(self) -> VersionInfo | None:
        return self.record.current

    @property
    def restarts(self) -> int:
        return self.record.restarts

    @property
    def last_error(self) -> str | None:
        return self.record.last_error

    @property
    def reload_phase(self) -> str | None:
        return self.record.phase

    @property
    def history(self) -> list[ReloadOutcome]:
        return self.record.history

    @property
    def closed(self) -> bool:  # the session is stopping: no job runs any more
        return self._closed

    @property
    def busy(self) -> bool:
        """A job runs or waits (a reload, a restart, ...)."""
        return self._running is not None or len(self._queue) > 0

    # ------------------------------------------------------------------ asking for jobs

    async def start(self) -> None:
        """Serve the model's first version; raises PhaseFailed naming the phase that failed
        (the model then answers its requests with why, until a reload)."""
        await asyncio.shield(self.submit(StartJob()).future)

    async def reload(
        self,
        trigger: str,
        detail: list[str] | None = None,
        *,
        weights_only: bool = False,
        push: Overlay | None = None,
    ) -> ReloadOutcome:
        """Reload and return the outcome. While one runs, requests collapse into exactly one
        follow-up reload (with the newest files), whose outcome they all get."""
        detail = list(detail or [])
        if self._closed:
            # A reload asked for during shutdown would start a worker nobody stops.
            return self.not_run(trigger, detail, "the session is stopping; the reload was not run")
        self.events.emit(
            "reload_requested",
            model=self.name,
            trigger=trigger,
            detail=", ".join(detail) or None,
            queued=self.busy,
        )
        job = ReloadJob(trigger=trigger, detail=detail, weights_only=weights_only, push=push)
        return await asyncio.shield(self.submit(job).future)

    async def push(self, descriptor: Any, *, strict: bool = True) -> dict[str, Any]:
        """A trainer's weights (a shared-memory descriptor) as the next version: built,
        warmed and smoke-tested in the serving worker, then swapped in. Returns the version
        and its digest; ReloadFailedError with the reason (the old weights serve on, never
        a mix), BadRequestError for a descriptor that is not one."""
        self._pushes += 1
        overlay = pushes.adopt(descriptor, strict, self._pushes)
        detail = [f"{len(overlay.names)} tensor(s){'' if strict else ', strict=False'}"]
        try:
            outcome = await self.reload("push", detail, push=overlay)
        finally:
            if overlay not in self.record.overlays:
                overlay.close()
        if not outcome.ok:
            raise ReloadFailedError(
                f"model {self.name!r}: pushed weights failed in {outcome.phase or 'the push'}: "
                f"{outcome.error}; v{outcome.version} keeps serving its weights"
            )
        digest = self.current.digest if self.current else None
        return {"version": outcome.version, "digest": digest}

    async def wait_version(self, version: int, timeout_s: float) -> int:
        """The serving version once it is `version` or later (bounded by `timeout_s`)."""
        return await self.router.wait_version(version, timeout_s)

    async def restart(self, reason: str, *, wedged: bool = False) -> None:
        """Kill the serving worker and restart it on the last good version."""
        job = RestartJob(reason=reason, wedged=wedged, worker=self.record.serving)
        await asyncio.shield(self.submit(job).future)

    async def unload(self) -> None:
        """Stop serving this model (repository API `unload`); a reload brings it back."""
        await asyncio.shield(self.submit(UnloadJob()).future)

    def submit(self, job: Job) -> Job:
        if self._closed:
            job.settle(error=WorkerUnavailableError(f"model {self.name!r} is stopping"))
            return job
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._loop(), name=f"jobs-{self.name}")
        return self._queue.add(job)

    def not_run(self, trigger: str, detail: list[str], why: str) -> ReloadOutcome:
        return ReloadOutcome(self.name, False, self.version, trigger, error=why, detail=detail)

    # ------------------------------------------------------------------ the job loop

    async def _loop(self) -> None:
        while not self._closed:
            job = await self._queue.next()
            self._running = job
            self._job_task = asyncio.create_task(self._run(job), name=f"{job.kind}-{self.name}")
            await asyncio.wait([self._job_task])
            self._running = self._job_task = None
            if not self._closed:
                await self.strategy.after_job()

    async def _run(self, job: Job) -> None:
        try:
            if isinstance(job, StartJob):
                await lifecycle.run_start(self)
            elif isinstance(job, ReloadJob):
                job.settle(await reload_job.run_reload(self, job))
            elif isinstance(job, RestartJob):
                await recovery.run_restart_job(self, job)
            elif isinstance(job, UnloadJob):
                await self._do_unload()
            job.settle()
        except asyncio.CancelledError:
            if isinstance(job, ReloadJob):
                job.settle(self.not_run(job.trigger, job.detail, STOPPED))
            else:
                job.settle(error=WorkerUnavailableError(f"model {self.name!r}: {STOPPED}"))
            raise
        except BaseException as exc:
            job.settle(error=exc)

    # ------------------------------------------------------------------ start

    # ------------------------------------------------------------------ deaths and hangs

    def _on_worker_death(self, worker: WorkerProcess) -> None:
        if self._closed or worker is not self.record.serving:
            return
        self.events.emit("worker_died", model=self.name, pid=worker.pid, reason=worker.exit_reason)
        # Queued behind the job running now: a reload whose worker died restarts it itself,
        # and this job then finds it replaced.
        self.submit(RestartJob(reason=worker.exit_reason or "worker died", worker=worker))

    def ensure_watchdog(self) -> None:
        if self._watchdog_task is None or self._watchdog_task.done():
            self._watchdog_task = asyncio.create_task(
                recovery.watch_forwards(self), name=f"watchdog-{self.name}"
            )

    # ------------------------------------------------------------------ unload and stop

    async def _do_unload(self) -> None:
        rec, d = self.record, self.model.deadlines
        self.router.close_gate()
        await self.router.drain(d.drain_wait_s)
        self.router.fail_queued(WorkerUnavailableError(f"model {self.name!r} was unloaded"))
        self.router.unavailable_reason = f"model {self.name!r} is unloaded; load it to serve again"
        worker, rec.serving = rec.serving, None
        self.router.worker = None
        if worker is not None:
            await worker.stop(d.stop_s)
        rec.last_version = max(rec.last_version, rec.version)
        if rec.current is not None and rec.current.block is not None:
            rec.current.block.close()
        rec.current = None
        self.set_state("unloaded")

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """The last job: the running one is cancelled (a build can take minutes), queued
        ones get "stopped"; then drain the requests in flight and stop every worker."""
        self._closed = True
        for job in self._queue.drain():
            if isinstance(job, ReloadJob):
                job.settle(self.not_run(job.trigger, job.detail, STOPPED))
            else:
                job.settle(error=WorkerUnavailableError(f"model {self.name!r}: {STOPPED}"))
        for task in (self._job_task, self._loop_task, self._watchdog_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.strategy.close()
        await lifecycle.drain_and_stop(self, drain_timeout_s)
        for overlay in self.record.overlays:
            overlay.close()
        if self.record.current is not None and self.record.current.block is not None:
            self.record.current.block.close()

    # ------------------------------------------------------------------ state changes

    def set_state(self, state: str, **fields: Any) -> None:
        if state != self.record.state:
            self.record.state = state
            self.events.emit("state", model=self.name, state=state, **fields)

    def enter_phase(self, name: str | None) -> None:
        self.record.phase = name

    def note_error(self, error: str | None) -> None:
        self.record.last_error = error

    def count_restart(self) -> None:
        self.record.restarts += 1

    def note_digest(self, info: VersionInfo, digest: str | None) -> None:
        info.digest, info.digest_pending = digest, False

    def add_history(self, outcome: ReloadOutcome) -> None:
        self.record.history.append(outcome)

    def set_good_snapshot(self, snapshot: Snapshot | None) -> Snapshot | None:
        """A restart comes back on `snapshot` from now on; returns the one it replaces."""
        old, self.record.good_snapshot = self.record.good_snapshot, snapshot
        return old

    def warn_weights_override(self, job: ReloadJob, info: VersionInfo) -> None:
        reload_job.warn_weights_override(self, job, info)

    def install(
        self,
        worker: WorkerProcess,
        info: VersionInfo,
        *,
        announce: bool = True,
        handover: bool = False,
        open_gate: bool = True,
    ) -> None:
        """Make `worker` serving `info` the live one. With `handover`, requests in flight on
        the previous worker finish there (ModelRouter.handover); without `open_gate`, the
        gate stays as it is (a swap behind a closed gate, reopened by `resume`)."""
        rec = self.record
        previous, rec.serving = rec.serving, worker
        if rec.current is not None and rec.current.block not in (None, info.block):
            rec.current.block.close()  # the files changed: the old worker's mapping is its own
        rec.current = info
        rec.last_version = max(rec.last_version, info.version)
        # The weights it serves: the files as it found them and the pushes it holds; pushes
        # no version needs any more (the files changed since) let go of their memory.
        for overlay in rec.overlays:
            if overlay not in info.overlays:
                overlay.close()
        rec.overlays, rec.weights_stat = list(info.overlays), info.weights_stat
        if previous is not worker:  # an in-place reload keeps its place
            self.workers.place(worker, serving=True)
            if previous is not None and not handover:
                # Drained already, or dead. One handed over from keeps the serving CPUs
                # until its requests are done (respawn moves it then).
                self.workers.place(previous, serving=False)
        # Requests are checked against the serving version's inputs, switched at the swap.
        self.router.input_form, self.router.input_signature = info.input_form, info.inputs
        self.set_state("serving", version=info.version)
        if announce:
            self.events.emit(
                "ready",
                model=self.name,
                version=info.version,
                device=worker.device,
                pid=worker.pid,
                load_s=info.load_s,
                warm_s=info.warm_s,
                inputs=describe_dynamic(info.inputs),
                digest=info.digest,
            )
        if handover:
            self.router.handover(worker)
        else:
            self.router.worker = worker
            if open_gate:
                self.router.open_gate()
        # Last: requests waiting for this version (`min_version`) go to its worker.
        self.router.serving_version(info.version)

    def keep_standby(
        self, worker: WorkerProcess, *, recycled: int = 0, after: str | None = None
    ) -> None:
        self.record.standby = worker
        fields = {"after": after} if after else {}
        self.events.emit(
            "standby_ready", model=self.name, pid=worker.pid, recycled=recycled, **fields
        )

    def take_standby(self) -> WorkerProcess | None:
        worker, self.record.standby = self.record.standby, None
        return worker

    def mark_retiring(self, worker: WorkerProcess | None) -> None:
        self.record.retiring = worker

    async def spawn(
        self, code: dict[str, Any] | None, *, standby: bool = False, phase: str = "spawn"
    ) -> WorkerProcess:
        """A new worker process. A `standby` starts at low priority and stays out of the
        death handling until a reload takes it (`adopt`)."""
        self.record.generation += 1
        worker = await self.workers.spawn(
            self.record.generation, code, standby=standby, phase=phase
        )
        if not standby:
            self.adopt(worker)
            self.events.emit(
                "worker_started", model=self.name, pid=worker.pid, device=worker.device
            )
        return worker

    def adopt(self, worker: WorkerProcess) -> None:
        """From now on its death is this model's business (restart, retries)."""
        worker.on_death = self._on_worker_death

    def note(self, notes: list[str] | None) -> None:
        """Say each of a version's notes (outputs left out of replies) once per session."""
        for text in notes or []:
            self.events.emit_once("model_note", model=self.name, message=text)

    def _pin_failed(self, pid: int) -> None:
        self.events.emit(
            "cpus_failed",
            model=self.name,
            pid=pid,
            detail="could not move every thread of the worker; it runs where it is",
        )

    # ------------------------------------------------------------------ locks and snapshots

    @contextlib.asynccontextmanager
    async def device_lock(self, outcome: ReloadOutcome | None = None) -> AsyncIterator[None]:
        device = (self.worker.device if self.worker else None) or self.model.device
        key = "cpu" if device in ("cpu", "auto") else device
        waited_note: list[str] = []
        async with self.locks.hold(key, on_wait=waited_note.append) as waited:
            if waited > 0.005 and outcome is not None:
                outcome.phases["lock"] = waited
                self.events.emit(
                    "phase_end",
                    model=self.name,
                    phase="lock",
                    duration_s=waited,
                    ok=True,
                    detail=waited_note[0] if waited_note else None,
                )
            yield

    # ------------------------------------------------------------------ status

    async def worker_status(self, timeout_s: float = 1.0, max_age_s: float = 0.0) -> dict[str, Any]:
        return await self._figures.read(self.record.serving, timeout_s, max_age_s)

    async def status(self, worker_max_age_s: float = 0.0) -> dict[str, Any]:
        return await model_status(self, worker_max_age_s)


STOPPED = "the session stopped before the reload finished"

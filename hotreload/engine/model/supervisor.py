"""One supervisor per served model: the only owner of its workers and its jobs.

Every change to which worker serves, or which version, is a job (jobs.py) run one at a
time by `JobLoop`. Each job is one method here, read top to bottom:

    _start    spawn -> [device lock] build -> serve              (the model's first worker)
    _reload   lock -> checkpoint wait -> snapshot -> [unchanged: stop] -> policy -> build
              -> swap -> retire -> digest -> promote -> history
    _push     lock -> base check -> build (the standby under respawn, else the serving
              worker) -> swap -> digest
    restart   recovery.py: kill -> [GPU reset] -> bring up the last good snapshot -> serve
    stop      the running job is cancelled, queued ones never run, workers stop

Its steps are functions (phases.py acts on workers, swaps.py moves traffic); a strategy
(inplace.py, respawn.py) says where a version is built and what becomes of the old worker,
and returns what it did, never calling back. Only state.py writes the record and the
router. Jobs run one at a time: a restart (a death, a forward hung past `forward_s`)
runs after a reload, never beside it. A failed build leaves the old version serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.engine.event_kinds import ReloadRequested, WorkerDied
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import (
    evals,
    phases,
    pushes,
    rollback,
    save,
    settings_change,
    snapshot_keeper,
    swaps,
    unchanged,
)
from hotreload.engine.model.built import Built
from hotreload.engine.model.inplace import InPlace
from hotreload.engine.model.jobs import (
    Job,
    JobLoop,
    PhaseFailed,
    PushJob,
    ReloadJob,
    ReloadOutcome,
    RestartJob,
    StartJob,
    UnloadJob,
    Wedged,
)
from hotreload.engine.model.override_check import OverrideWarner
from hotreload.engine.model.phases import BuildSpec, RunPhase, make_spec
from hotreload.engine.model.policy import choose_policy
from hotreload.engine.model.record import ModelRecord, ModelView
from hotreload.engine.model.recovery import Escalate, Recovery
from hotreload.engine.model.respawn import Respawn
from hotreload.engine.model.rollback import RollbackJob
from hotreload.engine.model.save import SaveJob
from hotreload.engine.model.standby import StandbyKeeper
from hotreload.engine.model.state import ModelState
from hotreload.engine.model.status import WorkerFigures, model_status
from hotreload.engine.model.workers import Spawner, WorkerFactory
from hotreload.engine.router import ModelRouter
from hotreload.engine.used_files import tried_imports
from hotreload.engine.worker_port import Worker
from hotreload.errors import ReloadFailedError, StaleBaseError, WorkerUnavailableError
from hotreload.protocol.messages import StatusReply

STOPPED = "the session stopped before the reload finished"


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
        spawn: Spawner | None = None,
        escalate: Escalate | None = None,
    ) -> None:
        """`spawn` makes a worker (tests: a scripted fake; by default a process);
        `escalate` runs after a wedged worker was killed (the session's GPU reset)."""
        self.config, self.events, self.locks = config, events, locks
        self.snapshot_dir = snapshot_dir
        self.router = ModelRouter(
            name=model.name,
            max_queue_size=model.max_queue_size,
            request_timeout_s=model.request_timeout_s,
            max_inflight=model.max_inflight,
        )
        self.workers = WorkerFactory(model, config, events, on_death=self._worker_died, make=spawn)
        self.st = ModelState(model, ignore or IgnoreRules(), events, self.router, self.workers)
        self.recovery = Recovery(self.st, self.workers, config.root, locks, self.submit, escalate)
        #: Read-only for everyone but state.py.
        self.record: ModelRecord = self.st.record
        # Pushes build in the serving worker, or in the standby under respawn (pushes.py).
        self.inplace, self.respawn = InPlace(self.workers), Respawn(self.st, self.workers)
        self.overrides = OverrideWarner(events)  # each tensor's warning said once
        self._pushes = 0
        self._figures = WorkerFigures()
        self.standby = StandbyKeeper(self.st, self.workers, config.root, self.respawn)
        # Between jobs: the next standby starts (strategy respawn), never beside a build.
        self.jobs = JobLoop(model.name, self._run, self.standby.start_soon)
        #: Each new version's eval: a task beside the job loop (evals.py), never in a job.
        self.evals = evals.Evals()

    # ------------------------------------------------------------------ read-only views

    #: The model's settings and ignore rules: ModelState owns them (settings_change.py).
    model = property(lambda self: self.st.model)
    ignore = property(lambda self: self.st.ignore)
    name = property(lambda self: self.model.name)
    worker = property(lambda self: self.record.serving)
    state = property(lambda self: self.record.state)
    version = property(lambda self: self.record.version)
    current = property(lambda self: self.record.current)
    restarts = property(lambda self: self.record.restarts)
    last_error = property(lambda self: self.record.last_error)
    reload_phase = property(lambda self: self.record.phase)
    history = property(lambda self: self.record.history)
    #: The session is stopping: no job runs any more.
    closed = property(lambda self: self.jobs.closed)

    @property
    def view(self) -> ModelView:
        """What front ends read: a frozen snapshot of the model's state and figures."""
        return self.st.view()

    def latency_windows(self) -> tuple[Any, Any]:
        return self.router.latency, self.router.queue_latency

    def set_latency_windows(self, latency: Any, queue: Any) -> None:
        self.st.set_latency_windows(latency, queue)  # windows that tell /metrics each sample

    @property
    def strategy(self) -> InPlace | Respawn:
        """Where a reload builds, as the model's settings say now."""
        return self.respawn if self.model.strategy == "respawn" else self.inplace

    @property
    def busy(self) -> bool:
        """A job runs or waits (a reload, a restart, ...)."""
        return self.jobs.busy

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
        force: bool = False,
        settings: settings_change.Settings | None = None,
    ) -> ReloadOutcome:
        """Reload; the outcome (unchanged.py: nothing built when nothing changed, unless
        `force`). Reloads asked for while one runs collapse into one (settings_change.py)."""
        detail = list(detail or [])
        if self.jobs.closed:
            # A reload asked for during shutdown would start a worker nobody stops.
            return self.not_run(trigger, detail, "the session is stopping; the reload was not run")
        self._requested(trigger, detail)
        job = ReloadJob(
            trigger=trigger, detail=detail, weights_only=weights_only,
            force=force or settings is not None, settings=settings,
        )  # fmt: skip
        return await asyncio.shield(self.submit(job).future)

    async def push(
        self, descriptor: Any, *, strict: bool = True, base_digest: str | None = None
    ) -> dict[str, Any]:
        """A trainer's weights (a shared-memory descriptor) as the next version, or why not:
        ReloadFailedError (the old weights serve on, never a mix); StaleBaseError (changed
        tensors only, on a `base_digest` no longer serving: the client sends them all)."""
        self._pushes += 1
        overlay = pushes.adopt(descriptor, strict, self._pushes)
        detail = [f"{len(overlay.names)} tensor(s){'' if strict else ', strict=False'}"]
        try:
            if self.jobs.closed:
                outcome = self.not_run("push", detail, "the session is stopping")
            else:
                self._requested("push", detail)
                job = PushJob(push=overlay, detail=detail, base_digest=base_digest)
                outcome = await asyncio.shield(self.submit(job).future)
                if job.stale:
                    raise StaleBaseError(job.stale)
        finally:
            if overlay not in self.record.overlays:
                overlay.close()  # it failed: its memory goes
        if not outcome.ok:
            raise ReloadFailedError(
                f"model {self.name!r}: pushed weights failed in {outcome.phase or 'the push'}: "
                f"{outcome.error}; v{outcome.version} keeps serving its weights"
            )
        cur = self.current
        digest, adapters = (cur.digest, cur.adapters) if cur else (None, None)
        return {"version": outcome.version, "digest": digest, "adapters": adapters}

    async def rollback(self, version: int | None = None) -> ReloadOutcome:
        """Serve kept version `version` again (None: the one before the serving one) as the
        next version (rollback.py); BadRequestError when it is not kept."""
        if self.jobs.closed:
            return self.not_run("rollback", [], "the session is stopping; nothing was rolled back")
        return await asyncio.shield(self.submit(RollbackJob(version=version)).future)

    async def save(self, folder: Path, *, force: bool = False) -> dict[str, Any]:
        """Write the serving version's weights into `folder` (save.py): what was written.
        A folder with files in it is refused unless `force` (its files may be overwritten)."""
        return await asyncio.shield(self.submit(SaveJob(folder=folder, force=force)).future)

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
        if self.jobs.closed:
            job.settle(error=WorkerUnavailableError(f"model {self.name!r} is stopping"))
            return job
        return self.jobs.submit(job)

    def use_settings(self, settings: settings_change.Settings) -> None:
        """Settings read each time they are used (settings_change.LIVE_KEYS): applied at
        once, nothing rebuilt. Others go through `reload(settings=...)`."""
        self.st.use_settings(settings.model, settings.ignore)

    def _worker_died(self, worker: Worker) -> None:
        """A serving worker died on its own (a segfault, the OOM killer): a restart job,
        queued behind the job running now (a reload whose worker died restarts it itself,
        and this job then finds it replaced)."""
        if self.jobs.closed or worker is not self.record.serving:
            return
        reason = worker.exit_reason or "worker died"
        self.events.emit(WorkerDied(model=self.name, pid=worker.pid, reason=worker.exit_reason))
        self.submit(RestartJob(reason=reason, worker=worker))

    def refuse_until_reload(self, why: str) -> None:
        """Answer requests at once with `why` until a version serves (a model never up)."""
        self.st.refuse_until_reload(why)

    def not_run(self, trigger: str, detail: list[str], why: str) -> ReloadOutcome:
        return ReloadOutcome(self.name, False, self.version, trigger, error=why, detail=detail)

    def _requested(self, trigger: str, detail: list[str]) -> None:
        self.events.emit(
            ReloadRequested(
                model=self.name, trigger=trigger, detail=", ".join(detail) or None, queued=self.busy
            )
        )

    # ------------------------------------------------------------------ the job loop

    async def _run(self, job: Job) -> None:
        try:
            # The last job's spill (state.spill_soon) ends before a job changes what is kept.
            await self.st.spilled()
            if isinstance(job, StartJob):
                await self._start()
                job.settle()
                return self.evals.after(self, None)  # answered first: the eval follows
            elif isinstance(job, ReloadJob) and job.settings is not None:
                outcome = await settings_change.reload_with(self, job, self._reload)
                return await self._settled(job, outcome)
            elif isinstance(job, ReloadJob):
                return await self._settled(job, await self._reload(job, self.strategy))
            elif isinstance(job, PushJob):
                return await self._settled(job, await self._push(job))
            elif isinstance(job, RollbackJob):
                return await self._settled(job, await rollback.run(self, job))
            elif isinstance(job, SaveJob):
                return job.settle(await save.run(self, job))
            elif isinstance(job, RestartJob):
                await self.recovery.run_job(job)
            elif isinstance(job, UnloadJob):
                await self.st.unload()
            job.settle()
        except asyncio.CancelledError:
            self._settle_stopped(job)
            raise
        except BaseException as exc:
            job.settle(error=exc)

    async def _settled(self, job: Job, outcome: ReloadOutcome) -> None:
        """The job's outcome to whoever asked, then, beside the job loop (the watchdog and
        the next job never wait for them), the kept pushes no version serves to disk
        (kept_versions.py) and the new version's eval (evals.py)."""
        job.settle(outcome)
        self.st.spill_soon()
        self.evals.after(self, outcome)

    # ------------------------------------------------------------------ start

    async def _start(self) -> None:
        """The model's first worker: spawn (outside the device lock), build, serve."""
        st = self.st
        candidate = await st.snapshot(
            self.snapshot_dir, self.config, self.ignore, self.record.next_version
        )
        run = st.runner(None)
        st.set_state("starting")
        try:
            # The process starts (torch's import) outside the device lock: only the build
            # touches the device, and several models may start side by side.
            async with self.workers.spawning(None, phase="start") as held:
                st.set_state("loading", pid=held.worker.pid)
                try:
                    async with self.st.device_lock(self.locks, worker=held.worker):
                        info = await phases.build(run, held.worker, self._spec("start"))
                        await phases.own_swap(held.worker)
                except PhaseFailed:
                    await held.worker.end(self.model.deadlines.stop_s)
                    raise
                worker = held.keep()
        except PhaseFailed as exc:
            st.set_state("failed", error=str(exc))
            st.note_error(str(exc))
            st.refuse_until_reload(f"failed to start ({exc.phase}: {exc})")
            await snapshot_keeper.discard(candidate)
            raise
        except BaseException:
            await snapshot_keeper.discard(candidate)  # cancelled (Ctrl-C at the first load)
            raise
        finally:
            st.job_done()
        st.install(worker, info)
        await self.st.settle_digest(run)
        await self.st.promote(candidate)
        self.recovery.ensure_watchdog(lambda: self.busy)

    # ------------------------------------------------------------------ reload

    async def _reload(self, job: ReloadJob, strategy: InPlace | Respawn) -> ReloadOutcome:
        """One reload, in order. A failure in load, warm or smoke leaves the old version
        serving (or restores it); a drain or sync past its deadline means a wedged worker,
        killed and restarted on the last good snapshot; a worker that died during the
        phases is restarted before the reload ends."""
        st, rec, started = self.st, self.record, time.monotonic()
        outcome = ReloadOutcome(
            self.name, False, self.version, job.trigger, detail=job.detail,
            strategy=strategy.name,
        )  # fmt: skip
        run = st.runner(outcome)
        inputs_before = list(rec.current.inputs) if rec.current else None
        try:
            # "Unchanged" is decided before any lock: a no-op save never waits for a reload
            # of another model (or, on a GPU, another session) to say so.
            async with contextlib.AsyncExitStack() as lock:
                candidate, locked = None, False
                try:
                    await phases.wait_for_checkpoints(run, self.model, self.events)
                    candidate = await st.snapshot(
                        self.snapshot_dir, self.config, self.ignore, rec.next_version
                    )
                    if not self._cold() and not job.force:  # the serving version again
                        await unchanged.check(outcome, self.model, self.config.root, rec, candidate)
                    if not outcome.unchanged:
                        await lock.enter_async_context(st.device_lock(self.locks, outcome))
                        locked = True
                        await self._build_and_swap(run, job, outcome, strategy)
                    outcome.ok = True
                except PhaseFailed as exc:
                    await self._failed(exc, outcome)
                except BaseException:
                    # Cancelled (shutdown): the snapshot of a version that never served goes.
                    if not snapshot_keeper.is_good(rec.good_snapshot, candidate):
                        snapshot_keeper.remove(candidate)
                    raise
                outcome.version, built = self.version, outcome.ok and not outcome.unchanged
                if built:
                    await st.settle_digest(run)
                    await st.promote(candidate, job.trigger)
                if self.recovery.lost() and not locked:  # its restart builds: it locks
                    await lock.enter_async_context(st.device_lock(self.locks))
                await self.recovery.restart_if_lost(outcome)
                if not built and not snapshot_keeper.is_good(rec.good_snapshot, candidate):
                    await snapshot_keeper.discard(candidate)
        except Exception as exc:
            outcome = ReloadOutcome.internal_error(self.name, self.version, job, exc)
        finally:
            st.job_done()
        return self.st.finish(outcome, started, inputs_before)

    def _cold(self) -> bool:
        """No version serves (a failed start, an unload, a give-up): a build starts cold."""
        serving = self.record.serving
        return serving is None or not serving.alive or self.record.current is None

    async def _build_and_swap(
        self,
        run: RunPhase,
        job: ReloadJob,
        outcome: ReloadOutcome,
        strategy: InPlace | Respawn,
    ) -> None:
        """The strategy builds the version; traffic moves to it one of three ways. Called
        holding the device lock: the serving worker is read after that wait (it may have
        died meanwhile), and the policy chosen from it."""
        st, rec = self.st, self.record
        old, cold = rec.serving, self._cold()
        outcome.policy = "start"
        if not cold:
            outcome.policy = await choose_policy(
                self.model, rec.current, old, self.worker_status, self.events
            )
        if cold or old is None:  # no live worker: a failed start, an unload, a give-up
            if old is not None:
                await old.end()
            built = await self._build(strategy, run, job, outcome, "cold")
            st.install(built.worker, built.info, announce=False)
            self.recovery.ensure_watchdog(lambda: self.busy)
        elif outcome.policy == "resource":  # unload first, behind a closed gate
            await swaps.quiesce(run, st, old)
            await run("release", lambda: phases.offload(old, self.model.deadlines.stop_s))
            try:
                built = await self._build(strategy, run, job, outcome, "reload")
            except PhaseFailed:
                await swaps.restore(st, old)
                raise
            await self.standby.keep_retired(await swaps.behind_gate(run, st, strategy, old, built))
        else:  # availability: built beside the old version, which serves on
            built = await self._build(strategy, run, job, outcome, "reload")
            await self.standby.keep_retired(
                await swaps.swap_in(run, st, strategy, old, built, outcome)
            )

    async def _build(
        self,
        strategy: InPlace | Respawn,
        run: RunPhase,
        job: ReloadJob | None,
        outcome: ReloadOutcome,
        mode: str,
        push: pushes.Overlay | None = None,
    ) -> Built:
        """The strategy's build (with the standby it may take), and what it kept or noted."""
        spec = self._spec(mode, job=job, push=push)
        standby = await self.standby.take() if strategy.wants_standby else None
        try:
            built = await strategy.build(run, spec, standby)
        except PhaseFailed as exc:
            if exc.standby is not None:
                await self.standby.keep(exc.standby, exc.recycled, after="a failed build")
            raise
        outcome.detail.extend(built.detail)
        self.overrides.check(self.model, job, self.current, built.info)
        return built

    # ------------------------------------------------------------------ push

    async def _push(self, job: PushJob) -> ReloadOutcome:
        """A push: the serving code again with the pushed tensors over the serving weights,
        built in the serving worker whatever the strategy (only the pushed tensors are new
        memory), then the in-band swap. No policy: it loads beside the serving version."""
        st, started = self.st, time.monotonic()
        outcome = ReloadOutcome(
            self.name, False, self.version, "push", policy="availability",
            strategy=self.inplace.name, detail=job.detail,
        )  # fmt: skip
        run = st.runner(outcome)
        try:
            async with self.st.device_lock(self.locks, outcome):
                try:
                    serving = self.record.serving
                    if serving is None or not serving.alive or self.record.current is None:
                        raise PhaseFailed(
                            "load",
                            f"model {self.name!r} is {self.state}: no version serves to push "
                            "weights onto; fix the model and reload it first",
                        )
                    # At build time, not at intake: a reload may have run in between.
                    job.stale = pushes.stale_base(self.name, job.base_digest, self.current)
                    if job.stale:
                        raise PhaseFailed("load", job.stale)
                    strategy, mode = pushes.builder(self, job, outcome)
                    built = await self._build(strategy, run, None, outcome, mode, job.push)
                    await self.standby.keep_retired(
                        await swaps.swap_in(run, st, strategy, serving, built, outcome)
                    )
                    outcome.ok = True
                except PhaseFailed as exc:
                    await self._failed(exc, outcome)
                outcome.version = self.version
                if outcome.ok:
                    await self.st.settle_digest(run)  # a push changes no file: the snapshot holds
                    await self.st.promote(self.record.good_snapshot, "push")  # kept, its pushes too
                await self.recovery.restart_if_lost(outcome)
        except Exception as exc:
            outcome = ReloadOutcome.internal_error(self.name, self.version, job, exc)
        finally:
            st.job_done()
        return self.st.finish(outcome, started)

    # ------------------------------------------------------------------ after a build

    async def _failed(self, exc: PhaseFailed, outcome: ReloadOutcome) -> None:
        outcome.phase, outcome.error = exc.phase, str(exc)
        outcome.traceback = exc.remote_traceback
        self.st.note_tried(tried_imports(exc))  # watched too: saving the fix reloads
        if isinstance(exc, Wedged):
            outcome.error = await self.recovery.wedged(exc)
        elif not self.recovery.lost():
            self.st.serve_on()

    def _spec(self, mode: str, *, job: Any = None, push: Any = None) -> BuildSpec:
        root, rec = self.config.root, self.record
        golden_dir = self.config.state_dir / "golden" / self.model.name  # `hotreload diff`
        if isinstance(job, RollbackJob):  # a kept version's code and weights (rollback.py)
            base = make_spec(self.model, root, rec, self.router, mode, None, None, self.events,
                             golden_dir)  # fmt: skip
            return rollback.spec(base, self, job)
        return make_spec(
            self.model, root, rec, self.router, mode, job, push, self.events, golden_dir
        )

    # ------------------------------------------------------------------ stop, status

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """The last job: the running one is cancelled (a build can take minutes), queued
        ones get "stopped"; then drain the requests in flight and stop every worker."""
        self.recovery.closed = True
        for job in await self.jobs.close():
            self._settle_stopped(job)
        await self.recovery.close()
        await self.evals.close()
        await self.st.spilled()  # its thread reads push memory drain_and_stop lets go of
        await self.standby.close()
        await self.st.drain_and_stop(drain_timeout_s)

    def _settle_stopped(self, job: Job) -> None:
        if isinstance(job, (ReloadJob, PushJob)):
            trigger = job.trigger if isinstance(job, ReloadJob) else "push"
            job.settle(self.not_run(trigger, job.detail, STOPPED))
        else:
            job.settle(error=WorkerUnavailableError(f"model {self.name!r}: {STOPPED}"))

    @property
    def last_worker_status(self) -> StatusReply | None:
        """The serving worker's figures as last read (status, the dashboard), unasked."""
        return self._figures.last

    async def worker_status(
        self, timeout_s: float = 1.0, max_age_s: float = 0.0
    ) -> StatusReply | None:
        return await self._figures.read(self.record.serving, timeout_s, max_age_s)

    async def status(self, worker_max_age_s: float = 0.0) -> dict[str, Any]:
        ws = await self.worker_status(max_age_s=worker_max_age_s)
        return model_status(self.model, self.record, self.router, self.workers, ws)

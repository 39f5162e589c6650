"""The reload protocol, one reloader per model: every phase timed, evented and bounded.

availability (load before unload):
    load -> warm -> smoke (old version keeps serving) -> gate -> drain -> sync -> swap
    -> resume -> release
resource (unload first, for models that cannot co-reside):
    gate -> drain -> sync -> release (offload the old version, kept to restore) -> load
    -> warm -> smoke -> swap -> resume
auto: availability when free memory covers the last measured footprint with margin.

Strategies: `inplace` re-imports the user's code in the same worker; `respawn` builds the new
version in another worker process, by default one started ahead of time (`standby`), so the
build shares neither the serving process's GIL nor its start-up time. The new worker then
takes over at once while the old one finishes its requests (the hand-over), and the old
one, its streams synced idle, becomes the next standby (`recycle` times per process): no
reload pays for a process start. A load that fails in such a reused worker is tried once
in a fresh process, because code with a one-time effect per process fails a second import.

A failure in load, warm or smoke leaves the old version serving (or restores it). A drain or
sync past its deadline means a wedged worker: it is killed and restarted on the last good
snapshot. Reloads are serialized per device (see locks.py); requests made while one runs
collapse into a single follow-up reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from pathlib import Path

from hotreload.engine.host import ModelHost
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.reload_outcome import PhaseFailed, ReloadJob, ReloadOutcome, Wedged
from hotreload.engine.reload_phases import ReloadPhases
from hotreload.engine.snapshots import Snapshot, SnapshotTooLarge, code_paths, take_snapshot
from hotreload.engine.worker_proc import WorkerDied, WorkerProcess, WorkerReplyError
from hotreload.paths import ensure_state_dir

__all__ = ["PhaseFailed", "ReloadOutcome", "Reloader", "Wedged"]


class Reloader(ReloadPhases):
    def __init__(
        self,
        host: ModelHost,
        locks: DeviceLocks,
        *,
        ignore: IgnoreRules | None = None,
        snapshot_dir: Path | None = None,
    ) -> None:
        self.host = host
        self.locks = locks
        self.events = host.events
        self.ignore = ignore or IgnoreRules()
        self.snapshot_dir = snapshot_dir
        self.history: list[ReloadOutcome] = []
        self._running: ReloadJob | None = None
        self._pending: ReloadJob | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Starting the next standby worker (strategy "respawn", `standby = true`).
        self._standby_task: asyncio.Task[None] | None = None
        #: Why workers are no longer reused for this model (None: they are, see `_recycle`).
        self.recycle_off: str | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None

    # ------------------------------------------------------------------ queueing

    async def request(
        self, trigger: str, detail: list[str] | None = None, *, weights_only: bool = False
    ) -> ReloadOutcome:
        """Ask for a reload and wait for its outcome. While one runs, requests collapse into
        exactly one follow-up reload (with the newest files), whose outcome they all get."""
        detail = list(detail or [])
        if self._closed:
            # A reload asked for during shutdown would start a worker nobody stops.
            return self._not_run(trigger, detail, "the session is stopping; the reload was not run")
        self.events.emit(
            "reload_requested",
            model=self.host.name,
            trigger=trigger,
            detail=", ".join(detail) or None,
            queued=self._running is not None,
        )
        if self._running is None:
            job = ReloadJob(
                trigger, detail, weights_only, asyncio.get_running_loop().create_future()
            )
            self._running = job
            self._task = asyncio.create_task(self._drive(job), name=f"reload-{self.host.name}")
            return await asyncio.shield(job.future)
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = ReloadJob(trigger, detail, weights_only, loop.create_future())
        else:
            self._pending.merge(trigger, detail, weights_only)
        return await asyncio.shield(self._pending.future)

    def _not_run(self, trigger: str, detail: list[str], why: str) -> ReloadOutcome:
        return ReloadOutcome(
            self.host.name, False, self.host.version, trigger, error=why, detail=detail
        )

    async def _drive(self, job: ReloadJob | None) -> None:
        while job is not None:
            try:
                outcome = await self._execute(job)
            except Exception as exc:
                # A bug of ours, not the user's: say so with the traceback, keep reloading.
                outcome = self._not_run(
                    job.trigger, job.detail, f"internal error during the reload: {exc!r}"
                )
                outcome.traceback = traceback.format_exc()
                self.events.emit(
                    "reload_failed",
                    model=self.host.name,
                    version=outcome.version,
                    phase=None,
                    error=outcome.error,
                    traceback=outcome.traceback,
                    trigger=job.trigger,
                )
            self.history.append(outcome)
            if not job.future.done():
                job.future.set_result(outcome)
            job, self._pending = self._pending, None
            self._running = job

    async def close(self) -> None:
        """Stop reloading (session shutdown): a reload running now is cancelled, and every
        caller still waiting, for it or for the follow-up, gets a failed outcome."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._drop_standby()
        for job in (self._running, self._pending):
            if job is not None and not job.future.done():
                job.future.set_result(
                    self._not_run(
                        job.trigger, job.detail, "the session stopped before the reload finished"
                    )
                )
        self._running = self._pending = None

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
            r = await old.request("retire", model.deadlines.stop_s)
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

    # ------------------------------------------------------------------ one reload

    async def _execute(self, job: ReloadJob) -> ReloadOutcome:
        host = self.host
        started = time.monotonic()
        outcome = ReloadOutcome(
            host.name,
            False,
            host.version,
            job.trigger,
            detail=job.detail,
            strategy=host.model.strategy,
        )
        device = (host.worker.device if host.worker else None) or host.model.device
        key = "cpu" if device in ("cpu", "auto") else device
        waited_note: list[str] = []
        async with self.locks.hold(key, on_wait=waited_note.append) as waited:
            if waited > 0.005:
                outcome.phases["lock"] = waited
                self.events.emit(
                    "phase_end",
                    model=host.name,
                    phase="lock",
                    duration_s=waited,
                    ok=True,
                    detail=waited_note[0] if waited_note else None,
                )
            # A worker being restarted (it died, or wedged) is the restart's until it is back.
            await host.wait_restart()
            host.reloading = True
            candidate: Snapshot | None = None
            try:
                candidate = await self._run_strategy(job, outcome)
                outcome.version = host.version
                if outcome.phase is None:
                    outcome.ok = True
                    await self._promote(candidate)
                if self._worker_lost():
                    # It died during a phase (a crash in the user's code, the OOM killer):
                    # bring the last good version back now, still holding the device lock.
                    await self._restart_lost_worker(outcome)
            finally:
                host.reload_phase = None
                host.reloading = False
            if self._worker_lost():  # died just now, its death deferred to us
                host.schedule_restart(reason="worker died")
            if not outcome.ok and candidate is not None and not self._is_good(candidate):
                await asyncio.to_thread(_remove, candidate.folder)
        outcome.total_s = time.monotonic() - started
        host.last_error = outcome.error if not outcome.ok else None
        self._ensure_standby()  # after the reload: its start never competes with a build
        self.events.emit(
            "reload_done" if outcome.ok else "reload_failed",
            model=host.name,
            version=outcome.version,
            total_s=outcome.total_s,
            policy=outcome.policy,
            strategy=outcome.strategy,
            phases=outcome.phases,
            trigger=outcome.trigger,
            phase=outcome.phase,
            error=outcome.error,
            traceback=outcome.traceback,
        )
        return outcome

    async def _run_strategy(self, job: ReloadJob, outcome: ReloadOutcome) -> Snapshot | None:
        """Pick the policy, snapshot the files, run the reload; returns the snapshot taken."""
        host = self.host
        cold = host.worker is None or not host.worker.alive or host.current is None
        if cold:
            outcome.policy = "start"
        else:
            outcome.policy, reason = await self._choose_policy()
            self.events.emit("policy", model=host.name, policy=outcome.policy, reason=reason)
        candidate = await self._candidate_snapshot(host.version + 1)
        try:
            if cold:
                await self._cold_start(job, outcome, candidate)
            elif host.model.strategy == "respawn":
                await self._respawn(job, outcome, candidate)
            elif outcome.policy == "availability":
                await self._inplace_availability(job, outcome)
            else:
                await self._inplace_resource(job, outcome)
        except PhaseFailed as exc:
            outcome.phase, outcome.error = exc.phase, str(exc)
            outcome.traceback = exc.remote_traceback
            if isinstance(exc, Wedged):
                await self._recover_wedge(exc, outcome)
            elif not self._worker_lost() and host.state not in ("failed", "unloaded"):
                # The old version serves on: let requests held by a closed gate through.
                if host.worker is not None and host.current is not None:
                    host.router.open_gate()
                host.set_state("serving", version=host.version)
        except BaseException:
            # Cancelled (shutdown): the snapshot of a version that never served goes too.
            if candidate is not None and not self._is_good(candidate):
                _remove(candidate.folder)
            raise
        return candidate

    def _is_good(self, snapshot: Snapshot) -> bool:
        good = self.host.good_snapshot
        return good is not None and good.folder == snapshot.folder

    def _worker_lost(self) -> bool:
        """The serving worker died and nothing is bringing it back yet."""
        host = self.host
        return (
            host.worker is not None
            and not host.worker.alive
            and not host.stopping
            and not host.restarting
            and host.state not in ("failed", "unloaded")
        )

    async def _restart_lost_worker(self, outcome: ReloadOutcome) -> None:
        host = self.host
        assert host.worker is not None
        died = host.worker.exit_reason or "worker died"
        await host.restart_now(reason=f"{died} during the reload")
        if host.state == "serving":
            note = f"the worker died ({died}) and was restarted with v{host.version}"
        else:
            note = f"the worker died ({died}) and could not be restarted: {host.last_error}"
        outcome.version = host.version
        if outcome.ok:
            outcome.detail.append(note)  # it died after the new version went live
        else:
            outcome.error = f"{outcome.error}; {note}"

    async def _recover_wedge(self, exc: PhaseFailed, outcome: ReloadOutcome) -> None:
        host = self.host
        self.events.emit("wedged", model=host.name, phase=exc.phase, detail=str(exc))
        host.set_state("wedged", phase=exc.phase)
        # cudaStreamSynchronize may never return: only killing the process gets out.
        await host.restart_now(reason=f"wedged in {exc.phase}", wedged=True)
        outcome.error = (
            f"{exc}; the worker was killed and restarted with v{host.version}"
            if host.state == "serving"
            else f"{exc}; the worker was killed and could not be restarted: {host.last_error}"
        )

    # ------------------------------------------------------------------ snapshots

    async def start_host(self) -> None:
        """First start of the model, with the snapshot a later restart falls back to."""
        candidate = await self._candidate_snapshot(1)
        try:
            await self.host.start()
        except BaseException:
            if candidate is not None:
                await asyncio.to_thread(_remove, candidate.folder)
            raise
        await self._promote(candidate)
        self._ensure_standby()

    async def _candidate_snapshot(self, version: int) -> Snapshot | None:
        if self.snapshot_dir is None:
            return None
        base = self.snapshot_dir / self.host.name
        try:
            ensure_state_dir(self.host.config.state_dir)
            return await asyncio.to_thread(
                take_snapshot,
                base,
                self.host.model,
                version,
                self.ignore,
                self.host.good_snapshot,
            )
        except (OSError, SnapshotTooLarge) as exc:
            self.events.emit(
                "snapshot_skipped",
                model=self.host.name,
                reason=f"{exc}; a restart will load the files on disk",
            )
            return None

    async def _promote(self, candidate: Snapshot | None) -> None:
        old = self.host.good_snapshot
        self.host.good_snapshot = candidate
        if old is not None and candidate is not None and old.folder != candidate.folder:
            # Off the event loop: it relays every request.
            await asyncio.to_thread(_remove, old.folder)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)

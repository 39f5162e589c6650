"""The reload protocol, one reloader per model: every phase timed, evented and bounded.

availability (load before unload):
    load -> warm -> smoke (old version keeps serving) -> gate -> drain -> sync -> swap
    -> resume -> release
resource (unload first, for models that cannot co-reside):
    gate -> drain -> sync -> release (offload the old version, kept to restore) -> load
    -> warm -> smoke -> swap -> resume
auto: availability when free memory covers the last measured footprint with margin.

Strategies: `inplace` re-imports the user's code in the same worker; `respawn` builds the new
version in another worker process and hands over to it (respawn.py).

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
from hotreload.engine.respawn import RespawnPhases
from hotreload.engine.snapshots import Snapshot, SnapshotTooLarge, take_snapshot
from hotreload.paths import ensure_state_dir

__all__ = ["PhaseFailed", "ReloadOutcome", "Reloader", "Wedged"]


class Reloader(RespawnPhases):
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
        self._standby_task = None
        self.recycle_off = None
        self.override_warned = False

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
        candidate = await self._candidate_snapshot(host.next_version)
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
        candidate = await self._candidate_snapshot(self.host.next_version)
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

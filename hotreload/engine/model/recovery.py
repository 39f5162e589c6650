"""Bringing a model back: a worker that died, a forward hung past its deadline, a reload
that wedged in its drain or sync. Each ends with a fresh worker serving the last good
version (from its snapshot: the files on disk may hold a broken edit), or with the model
marked failed and its requests answered with why.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hotreload.engine.event_kinds import (
    RestartFailed,
    SnapshotRewritten,
    Wedged,
    WorkerRestarted,
)
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import phases, snapshot_keeper
from hotreload.engine.model.jobs import Job, PhaseFailed, ReloadOutcome, RestartJob
from hotreload.engine.model.phases import BuildSpec, make_spec
from hotreload.engine.model.state import ModelState
from hotreload.engine.model.workers import WorkerFactory
from hotreload.errors import WorkerUnavailableError

#: Tries of a restart before the model is marked failed (0.2 s, then doubling, between).
RESTART_ATTEMPTS = 3
#: The session's GPU reset after a wedged worker was killed (`[gpu] reset`): told the
#: model's name and the device the worker ran on.
Escalate = Callable[[str, "str | None"], Awaitable[None]]


async def restart(
    st: ModelState,
    workers: WorkerFactory,
    spec: BuildSpec,
    reason: str,
    *,
    escalate: Escalate | None,
    closed: Callable[[], bool],
    wedged: bool = False,
) -> None:
    """Replace a dead or wedged worker with a fresh one serving the same version (`spec`,
    made for mode "restart" on the last good snapshot). `escalate`: a wedged worker's GPU
    reset, where `[gpu] reset` allows one."""
    rec = st.record
    st.close_gate()
    st.set_state("restarting", reason=reason)
    old = rec.serving
    if old is not None and old.alive:
        if wedged:
            st.blame_hung(old)  # before the kill fails what it holds
        await old.end()
    if escalate is not None:
        await escalate(st.name, (old.device if old else None) or st.model.device)
    told = snapshot_keeper.rewritten_message(rec.good_snapshot, spec.version)
    if told is not None:
        st.events.emit(SnapshotRewritten(model=st.name, files=told[0], message=told[1]))
    run = st.runner(None)
    delay = 0.2
    try:
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            if closed():
                return
            try:
                worker, info = await phases.bring_up(run, workers, spec, spawn_phase="start")
            except PhaseFailed as exc:
                st.note_error(f"restart {attempt}/{RESTART_ATTEMPTS} failed in {exc.phase}: {exc}")
                st.events.emit(
                    RestartFailed(model=st.name, attempt=attempt, phase=exc.phase,
                    error=str(exc)))  # fmt: skip
                await asyncio.sleep(delay)
                delay *= 2
                continue
            st.count_restart()
            st.events.emit(
                WorkerRestarted(model=st.name, pid=worker.pid, version=spec.version, reason=reason)
            )
            st.install(worker, info)
            return
    finally:
        st.job_done()
    st.set_state("failed", error=rec.last_error)
    st.refuse(
        f"model {st.name!r} has no worker: {rec.last_error}; fix the error and save, "
        "or run `hotreload reload`",
        WorkerUnavailableError(
            f"model {st.name!r}: worker could not be restarted: {rec.last_error}"
        ),
    )


def worker_lost(st: ModelState, closed: bool) -> bool:
    """The serving worker died and nothing is bringing it back yet."""
    rec = st.record
    return (
        rec.serving is not None
        and not rec.serving.alive
        and not closed
        and rec.state not in ("failed", "unloaded")
    )


def lost_note(st: ModelState, died: str) -> str:
    """What a reload says of a worker that died during it, once the restart is done."""
    if st.record.state == "serving":
        return f"the worker died ({died}) and was restarted with v{st.record.version}"
    return f"the worker died ({died}) and could not be restarted: {st.record.last_error}"


def wedge_note(st: ModelState, exc: PhaseFailed) -> str:
    """What a wedged reload says once the worker was killed and restarted (or not)."""
    if st.record.state == "serving":
        return f"{exc}; the worker was killed and restarted with v{st.record.version}"
    return f"{exc}; the worker was killed and could not be restarted: {st.record.last_error}"


def hung_forward(st: ModelState, busy: bool) -> float | None:
    """The age of a forward hung past `forward_s` on a live serving worker, when no job runs
    (a reload's drain behind it hits its own deadline and recovers), else None."""
    age = st.router.oldest_inflight_age()
    worker = st.record.serving
    if age > st.model.deadlines.forward_s and worker is not None and worker.alive and not busy:
        return age
    return None


class Recovery:
    """A model's restarts: after a death, a hung forward (the watchdog) or a wedged reload.
    The supervisor owns it and calls it; it asks for jobs through `submit` only."""

    def __init__(
        self,
        st: ModelState,
        workers: WorkerFactory,
        root: Path,
        locks: DeviceLocks,
        submit: Callable[[Job], Any],
        escalate: Escalate | None = None,
    ) -> None:
        self.st, self.workers, self.root, self.locks = st, workers, root, locks
        self.submit = submit
        self.escalate = escalate
        self.closed = False
        self._watchdog: asyncio.Task[None] | None = None

    async def restart(self, reason: str, *, wedged: bool = False) -> None:
        """Replace a dead or wedged worker with a fresh one serving the same version."""
        st = self.st
        st.end_trial()  # the old worker comes back with the settings it was started with
        spec = make_spec(st.model, self.root, st.record, st.router, "restart", events=st.events)
        await restart(
            st,
            self.workers,
            spec,
            reason,
            escalate=self.escalate if wedged else None,
            closed=lambda: self.closed,
            wedged=wedged,
        )
        if st.record.state == "serving":
            await st.settle_digest(st.runner(None))

    async def run_job(self, job: RestartJob) -> None:
        st = self.st
        if job.worker is not st.record.serving or st.record.state in ("failed", "unloaded"):
            return  # already replaced (by the reload it queued behind), or given up on
        hung = st.router.oldest_inflight_age() > st.model.deadlines.forward_s
        if job.wedged and job.worker is not None and job.worker.alive and not hung:
            st.set_state("serving", version=st.record.version)  # it finished after all
            return
        async with st.device_lock(self.locks):
            await self.restart(job.reason, wedged=job.wedged)

    async def wedged(self, exc: PhaseFailed) -> str:
        """A reload's drain or sync passed its deadline: kill the worker and restart it
        (cudaStreamSynchronize may never return: only killing the process gets out)."""
        st = self.st
        st.events.emit(Wedged(model=st.name, phase=exc.phase, detail=str(exc)))
        st.set_state("wedged", phase=exc.phase)
        await self.restart(f"wedged in {exc.phase}", wedged=True)
        return wedge_note(st, exc)

    def lost(self) -> bool:
        return worker_lost(self.st, self.closed)

    async def restart_if_lost(self, outcome: ReloadOutcome) -> None:
        """The worker died during the job (a crash in the user's code, the OOM killer):
        bring the last good version back now, in this job."""
        if not self.lost():
            return
        assert self.st.record.serving is not None
        died = self.st.record.serving.exit_reason or "worker died"
        await self.restart(f"{died} during the reload")
        note = lost_note(self.st, died)
        outcome.version = self.st.record.version
        if outcome.ok:
            outcome.detail.append(note)  # it died after the new version went live
        else:
            outcome.error = f"{outcome.error}; {note}"

    def ensure_watchdog(self, busy: Callable[[], bool]) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(
                self._watch_forwards(busy), name=f"watchdog-{self.st.name}"
            )

    async def _watch_forwards(self, busy: Callable[[], bool], interval_s: float = 0.25) -> None:
        """Queue a restart for a worker whose oldest in-flight request exceeds forward_s.
        Not while a job runs: a reload's drain behind the hung forward hits its own
        deadline and recovers, and a restart queued then would only find it replaced."""
        st = self.st
        while not self.closed:
            limit = st.model.deadlines.forward_s  # read again: an edit of the config applies
            await asyncio.sleep(min(interval_s, limit / 4))
            age = hung_forward(st, busy())
            if age is None:
                continue
            st.set_state("wedged", forward_s=age)
            st.events.emit(
                Wedged(
                    model=st.name,
                    phase="serve",
                    detail=f"a forward has run for {age:.1f} s (limit {limit:g} s)",
                )
            )
            worker = st.record.serving
            self.submit(
                RestartJob(reason=f"forward hung for {age:.1f} s", wedged=True, worker=worker)
            )

    async def close(self) -> None:
        self.closed = True
        task = self._watchdog
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

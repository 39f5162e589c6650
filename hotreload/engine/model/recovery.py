"""Bringing a model back: a worker that died, a forward hung past its deadline, a reload
that wedged in its drain or sync. Each ends with a fresh worker serving the last good
version (from its snapshot: the files on disk may hold a broken edit), or with the model
marked failed and its requests answered with why.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from hotreload.engine.model import phases
from hotreload.engine.model.jobs import PhaseFailed, ReloadOutcome, RestartJob
from hotreload.engine.model.phases import PhaseRunner
from hotreload.engine.snapshots import code_paths
from hotreload.errors import WorkerUnavailableError

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor

#: Tries of a restart before the model is marked failed (0.2 s, then doubling, between).
RESTART_ATTEMPTS = 3


async def run_restart_job(sup: Supervisor, job: RestartJob) -> None:
    rec = sup.record
    if job.worker is not rec.serving or rec.state in ("failed", "unloaded"):
        return  # already replaced (by the reload it queued behind), or given up on
    hung = sup.router.oldest_inflight_age() > sup.model.deadlines.forward_s
    if job.wedged and job.worker is not None and job.worker.alive and not hung:
        sup.set_state("serving", version=sup.version)  # the forward finished after all
        return
    async with sup.device_lock():
        await restart(sup, job.reason, wedged=job.wedged)


async def restart(sup: Supervisor, reason: str, *, wedged: bool = False) -> None:
    """Replace a dead or wedged worker with a fresh one serving the same version."""
    rec = sup.record
    sup.router.close_gate()
    sup.set_state("restarting", reason=reason)
    old = rec.serving
    if old is not None and old.alive:
        await old.kill()
    if wedged and sup.escalate is not None:
        # The GPU layer decides (config `[gpu] reset`) whether a reset is allowed now.
        await sup.escalate(sup)
    version = rec.version or 1
    code = code_paths(sup.model, sup.config.root, rec.good_snapshot)
    _tell_rewritten(sup, version)
    runner = PhaseRunner(sup)
    delay = 0.2
    try:
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            if sup.closed:
                return
            try:
                worker, info = await phases.bring_up(
                    runner, version, code=code, mode="restart", spawn_phase="start"
                )
            except PhaseFailed as exc:
                sup.note_error(f"restart {attempt}/{RESTART_ATTEMPTS} failed in {exc.phase}: {exc}")
                sup.events.emit(
                    "restart_failed",
                    model=sup.name,
                    attempt=attempt,
                    phase=exc.phase,
                    error=str(exc),
                )
                await asyncio.sleep(delay)
                delay *= 2
                continue
            sup.count_restart()
            sup.events.emit(
                "worker_restarted", model=sup.name, pid=worker.pid, version=version, reason=reason
            )
            sup.install(worker, info)
            await phases.settle_digest(runner)
            return
    finally:
        sup.enter_phase(None)
    sup.set_state("failed", error=rec.last_error)
    sup.router.unavailable_reason = (
        f"model {sup.name!r} has no worker: {rec.last_error}; fix the error and save, "
        "or run `hotreload reload`"
    )
    sup.router.fail_queued(
        WorkerUnavailableError(
            f"model {sup.name!r}: worker could not be restarted: {rec.last_error}"
        )
    )


def _tell_rewritten(sup: Supervisor, version: int) -> None:
    good = sup.record.good_snapshot
    rewritten = good.rewritten() if good else []
    if rewritten:
        sup.events.emit(
            "snapshot_rewritten",
            model=sup.name,
            files=[str(p) for p in rewritten],
            message=f"{', '.join(p.name for p in rewritten)} rewritten in place since "
            f"v{version} loaded (large files are linked, not copied): the restart loads "
            "the current contents; save weights to a new file and rename it over the old "
            "to keep a restart on the last good bytes",
        )


def worker_lost(sup: Supervisor) -> bool:
    """The serving worker died and nothing is bringing it back yet."""
    rec = sup.record
    return (
        rec.serving is not None
        and not rec.serving.alive
        and not sup.closed
        and rec.state not in ("failed", "unloaded")
    )


async def restart_lost_worker(sup: Supervisor, outcome: ReloadOutcome) -> None:
    """The worker died during a reload's phases: restart it within the reload's job."""
    assert sup.record.serving is not None
    died = sup.record.serving.exit_reason or "worker died"
    await restart(sup, reason=f"{died} during the reload")
    if sup.state == "serving":
        note = f"the worker died ({died}) and was restarted with v{sup.version}"
    else:
        note = f"the worker died ({died}) and could not be restarted: {sup.record.last_error}"
    outcome.version = sup.version
    if outcome.ok:
        outcome.detail.append(note)  # it died after the new version went live
    else:
        outcome.error = f"{outcome.error}; {note}"


async def recover_wedge(sup: Supervisor, exc: PhaseFailed, outcome: ReloadOutcome) -> None:
    """A reload's drain or sync passed its deadline: kill the worker and restart it."""
    sup.events.emit("wedged", model=sup.name, phase=exc.phase, detail=str(exc))
    sup.set_state("wedged", phase=exc.phase)
    # cudaStreamSynchronize may never return: only killing the process gets out.
    await restart(sup, reason=f"wedged in {exc.phase}", wedged=True)
    outcome.error = (
        f"{exc}; the worker was killed and restarted with v{sup.version}"
        if sup.state == "serving"
        else f"{exc}; the worker was killed and could not be restarted: {sup.record.last_error}"
    )


async def watch_forwards(sup: Supervisor, interval_s: float = 0.25) -> None:
    """Queue a restart for a worker whose oldest in-flight request exceeds forward_s. Not
    while a job runs: a reload's drain behind the hung forward hits its own deadline and
    recovers, and a restart queued then would only find the worker replaced."""
    limit = sup.model.deadlines.forward_s
    while not sup.closed:
        await asyncio.sleep(min(interval_s, limit / 4))
        age = sup.router.oldest_inflight_age()
        worker = sup.record.serving
        if age > limit and worker is not None and worker.alive and not sup.busy:
            sup.set_state("wedged", forward_s=age)
            sup.events.emit(
                "wedged",
                model=sup.name,
                phase="serve",
                detail=f"a forward has run for {age:.1f} s (limit {limit:g} s)",
            )
            sup.submit(
                RestartJob(reason=f"forward hung for {age:.1f} s", wedged=True, worker=worker)
            )

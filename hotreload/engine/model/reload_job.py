"""One reload, start to end: the device lock, the policy, a snapshot of the files, the
strategy's phases (inplace.py, respawn.py), and what to do when one of them fails.

A failure in load, warm or smoke leaves the old version serving (or restores it). A drain or
sync past its deadline means a wedged worker: it is killed and restarted on the last good
snapshot. A worker that died during the phases is restarted before the reload ends.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING, Any

from hotreload.engine.checkpoint_ready import wait_until_complete
from hotreload.engine.model import phases, recovery, snapshot_keeper
from hotreload.engine.model.jobs import PhaseFailed, ReloadJob, ReloadOutcome, Wedged
from hotreload.engine.model.phases import PhaseRunner
from hotreload.engine.model.policy import choose_policy
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.signature import inputs_change
from hotreload.engine.snapshots import Snapshot

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor


async def run_reload(sup: Supervisor, job: ReloadJob) -> ReloadOutcome:
    started = time.monotonic()
    outcome = ReloadOutcome(
        sup.name, False, sup.version, job.trigger, detail=job.detail, strategy=sup.model.strategy
    )
    inputs_before = list(sup.current.inputs) if sup.current else None
    try:
        async with sup.device_lock(outcome):
            candidate: Snapshot | None = None
            try:
                candidate = await _run_locked(sup, job, outcome)
                outcome.version = sup.version
                if outcome.phase is None:
                    outcome.ok = True
                    await phases.settle_digest(PhaseRunner(sup, outcome))
                    if job.push is None:  # a push changes no file: the snapshot holds
                        await snapshot_keeper.promote(sup, candidate)
                if recovery.worker_lost(sup):
                    # It died during a phase (a crash in the user's code, the OOM killer):
                    # bring the last good version back now, in this job.
                    await recovery.restart_lost_worker(sup, outcome)
            finally:
                sup.enter_phase(None)
            if not outcome.ok and not snapshot_keeper.is_good(sup, candidate):
                await snapshot_keeper.discard(candidate)
    except Exception as exc:
        # A bug of ours, not the user's: say so with the traceback, keep reloading.
        outcome = sup.not_run(job.trigger, job.detail, f"internal error during the reload: {exc!r}")
        outcome.traceback = traceback.format_exc()
    outcome.total_s = time.monotonic() - started
    sup.note_error(outcome.error if not outcome.ok else None)
    sup.add_history(outcome)
    sup.events.emit(
        "reload_done" if outcome.ok else "reload_failed",
        model=sup.name,
        version=outcome.version,
        total_s=outcome.total_s,
        policy=outcome.policy,
        strategy=outcome.strategy,
        phases=outcome.phases,
        trigger=outcome.trigger,
        phase=outcome.phase,
        error=outcome.error,
        traceback=outcome.traceback,
        digest=sup.current.digest if sup.current else None,
        **_inputs_changed(inputs_before, sup) if outcome.ok else {},
    )
    return outcome


def _inputs_changed(before: list[dict[str, Any]] | None, sup: Supervisor) -> dict[str, str]:
    """`inputs_changed` for reload_done when the reload changed what requests must send."""
    change = inputs_change(before, sup.current.inputs) if before and sup.current else None
    return {"inputs_changed": change} if change else {}


async def _run_locked(sup: Supervisor, job: ReloadJob, outcome: ReloadOutcome) -> Snapshot | None:
    """Pick the policy, snapshot the files, run the strategy; returns the snapshot taken."""
    rec = sup.record
    runner = PhaseRunner(sup, outcome)
    cold = rec.serving is None or not rec.serving.alive or rec.current is None
    if cold:
        outcome.policy = "start"
    else:
        outcome.policy, reason = await choose_policy(sup)
        sup.events.emit("policy", model=sup.name, policy=outcome.policy, reason=reason)
    candidate: Snapshot | None = None
    try:
        if job.push is not None:
            if cold:
                raise PhaseFailed(
                    "load",
                    f"model {sup.name!r} is {rec.state}: no version serves to push weights "
                    "onto; fix the model and reload it first",
                )
            # The serving worker builds it, whatever the strategy: the code is the one
            # serving, and only the pushed tensors are new memory.
            await sup.inplace.reload(runner, job, "availability")
            return None
        await wait_for_checkpoints(sup, runner)
        candidate = await snapshot_keeper.candidate(sup, rec.next_version)
        if cold:
            # No live worker (the first start failed, unloaded, or restarts gave up).
            if rec.serving is not None and not rec.serving.alive:
                await rec.serving.kill()
            new, info = await sup.strategy.new_worker(runner, job, rec.next_version)
            sup.install(new, info, announce=False)
            sup.ensure_watchdog()
        else:
            await sup.strategy.reload(runner, job, outcome.policy)
    except PhaseFailed as exc:
        outcome.phase, outcome.error = exc.phase, str(exc)
        outcome.traceback = exc.remote_traceback
        if isinstance(exc, Wedged):
            await recovery.recover_wedge(sup, exc, outcome)
        elif not recovery.worker_lost(sup) and rec.state not in ("failed", "unloaded"):
            # The old version serves on: let requests held by a closed gate through.
            if rec.serving is not None and rec.current is not None:
                sup.router.open_gate()
            sup.set_state("serving", version=sup.version)
    except BaseException:
        # Cancelled (shutdown): the snapshot of a version that never served goes too.
        if not snapshot_keeper.is_good(sup, candidate):
            snapshot_keeper.remove(candidate)
        raise
    return candidate


async def wait_for_checkpoints(sup: Supervisor, runner: PhaseRunner) -> None:
    """A weights file still being written (a trainer's save) is waited for, to
    `deadlines.checkpoint_s`, instead of failing to load: a phase only when it has to wait,
    and a failed one, naming the file, when the wait runs out."""
    # A missing file is the load's to report, at once: nothing is writing it.
    files = [p for p in sup.model.weights if p.exists()]
    if not files:
        return
    if not await wait_until_complete(files, deadline_s=0):
        return  # complete (one look at each file's structure): no phase to show
    deadline = sup.model.deadlines.checkpoint_s
    waited: list[str] = []

    def on_wait(path: Any, problem: str) -> None:
        waited.append(f"{path.name} ({problem})")
        sup.events.emit(
            "checkpoint_wait",
            model=sup.name,
            file=str(path),
            message=f"waiting up to {deadline:g} s for {path.name} to be complete ({problem})",
        )

    async def checkpoint() -> dict[str, Any]:
        left = await wait_until_complete(files, deadline_s=deadline, on_wait=on_wait)
        if left:
            problems = "; ".join(f"{p.name}: {why}" for p, why in left.items())
            raise PhaseFailed(
                "checkpoint",
                f"weights still incomplete after the {deadline:g} s checkpoint deadline "
                f"({problems}); save to a temporary file and rename it over the old one",
            )
        return {"detail": "waited for " + "; ".join(waited)}

    await runner.run("checkpoint", checkpoint)


def warn_weights_override(sup: Supervisor, job: ReloadJob, info: VersionInfo) -> None:
    """Once: an edit of the code left the example's output the same to the bit, and weights
    are declared. Likely the edit changed a value build() sets parameters from (SCALE),
    which the weights file then overwrote: without a word, it looks as if reloading did not
    work."""
    old = sup.record.current
    if (
        sup.override_warned
        or job.weights_only
        or "file" not in job.trigger.split("+")
        or old is None
        or info.output_digest is None
        or info.output_digest != old.output_digest
    ):
        return
    sup.override_warned = True
    files = ", ".join(p.name for p in sup.model.weights)
    sup.events.emit(
        "weights_override",
        model=sup.name,
        version=info.version,
        message=(
            f"v{info.version} answers the example exactly as v{old.version} did although its "
            f"code changed: {files} is loaded after build() and overrides the parameters "
            "build() sets, so editing a value they are initialised from changes nothing; "
            "change the weights file, or apply the value in forward() (shown once)"
        ),
    )

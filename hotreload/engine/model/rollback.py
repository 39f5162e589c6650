"""The rollback job: a kept version (kept_versions.py) built again as the next version.

    choose -> lock -> policy -> build (the kept code and weights, its pushes) -> swap
           -> digest -> keep -> history ("rollback", "to vN")

It runs the steps of a reload (supervisor._build_and_swap: load, warm, smoke, swap, as the
strategy and policy say), with the kept version's code, weights and pushes in place of the
files on disk. A failed build leaves the serving version serving, as a reload's does.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from hotreload.config import ModelConfig
from hotreload.engine.model import kept_versions, settings_change
from hotreload.engine.model.jobs import Job, PhaseFailed, ReloadOutcome
from hotreload.engine.model.phases import BuildSpec
from hotreload.engine.model.pushes import Overlay, WeightsPlan
from hotreload.errors import BadRequestError

#: The model's supervisor.ModelSupervisor (which imports this module: typed loosely here).
Supervisor = Any


@dataclass
class RollbackJob(Job):
    """Serve kept version `version` again (None: the one that served before the serving
    one). Never merged with another job: each rollback is a version of its own."""

    kind: ClassVar[str] = "rollback"
    version: int | None = None
    detail: list[str] = field(default_factory=list)
    #: The kept version chosen when the job runs (the kept ones may change while it waits),
    #: and its pushes with memory to read again (kept_versions.restored).
    target: kept_versions.KeptVersion | None = None
    overlays: list[Overlay] = field(default_factory=list)
    #: A rollback imports the kept code again (supervisor._build reads it as a reload's).
    weights_only: bool = False
    trigger: ClassVar[str] = "rollback"


def spec(base: BuildSpec, sup: Supervisor, job: RollbackJob) -> BuildSpec:
    """A reload's spec (`base`, made with no job) with the kept version's code, weights
    and pushes."""
    target = job.target
    assert target is not None
    rec = sup.record
    serving_overlays, serving_stat = list(rec.overlays), rec.weights_stat

    def weights(same_worker: bool) -> WeightsPlan:
        return kept_versions.rollback_plan(
            target,
            job.overlays,
            serving_overlays,
            serving_stat,
            same_worker=same_worker,
            serving_block=base.serving_block.descriptor if base.serving_block else None,
        )

    return replace(
        base,
        code=kept_versions.rollback_code(sup.model, sup.config.root, target),
        reimport=True,
        overlays=list(job.overlays),
        weights_stat=target.weights_stat,
        weights=weights,
    )


def settings_changed(k: kept_versions.KeptVersion, now: ModelConfig) -> tuple[str, ...]:
    """The settings a build reads (entry, weights, weights_prefix, env, adapters, ...) that
    differ between the ones `k` was built with and `now`: a rollback refuses to build it
    under other ones (its history would say "to vN" for something vN never served). Live
    settings (settings_change.LIVE_KEYS: limits, deadlines, ...) are read as they are now."""
    if k.model is None or k.model == now:
        return ()
    changed = settings_change.classify(k.model, now)
    return changed.reload + tuple(key for key in changed.restart if key != "name")


async def run(sup: Supervisor, job: RollbackJob) -> ReloadOutcome:
    """The rollback, in order. BadRequestError (before anything is built or written to the
    history) when the version asked for is not kept or cannot be built again."""
    st, rec, started = sup.st, sup.record, time.monotonic()
    target = kept_versions.choose(sup.name, rec.kept, rec.version, job.version)
    changed = settings_changed(target, sup.model)
    if changed:
        raise BadRequestError(
            f"model {sup.name!r}: cannot roll back to v{target.version}: it was built with other "
            f"settings ({', '.join(changed)} changed since); put those back in the model's "
            "section to roll back to it, or reload"
        )
    why = kept_versions.why_not_buildable(target)
    if why is not None:
        raise BadRequestError(f"model {sup.name!r}: cannot roll back to v{target.version}: {why}")
    folder = kept_versions.pushes_folder(target)
    try:
        job.overlays = await asyncio.to_thread(kept_versions.restored_all, target.overlays, folder)
    except OSError as exc:
        raise BadRequestError(
            f"model {sup.name!r}: cannot roll back to v{target.version}: its pushed weights "
            f"cannot be read back from {folder} ({exc})"
        ) from None
    job.target = target
    job.detail = [f"to v{target.version}"]
    strategy = sup.strategy
    outcome = ReloadOutcome(
        sup.name, False, sup.version, "rollback", detail=list(job.detail),
        strategy=strategy.name, rollback_of=target.version,
    )  # fmt: skip
    sup._requested("rollback", job.detail)
    run_phase = st.runner(outcome)
    inputs_before = list(rec.current.inputs) if rec.current else None
    try:
        async with st.device_lock(sup.locks, outcome):
            try:
                await sup._build_and_swap(run_phase, job, outcome, strategy)
                outcome.ok = True
            except PhaseFailed as exc:
                await sup._failed(exc, outcome)
            outcome.version = sup.version
            if outcome.ok:
                await st.settle_digest(run_phase)
                await st.promote(target.snapshot, "rollback", target.version)
            await sup.recovery.restart_if_lost(outcome)
    except Exception as exc:
        outcome = ReloadOutcome.internal_error(sup.name, sup.version, job, exc)
    finally:
        st.job_done()
        for overlay in job.overlays:  # memory made for a build that did not serve
            if overlay not in target.overlays and overlay not in rec.overlays:
                overlay.close()
    return st.finish(outcome, started, inputs_before)

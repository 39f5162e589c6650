"""A model's `[[models]]` section edited while it serves: which settings apply how.

Three kinds, by what the setting reaches:

    live      read each time they are used (queue and timeout limits, deadlines, policy,
              warm-up passes, what is watched): applied at once, nothing is rebuilt
    reload    fixed when a worker process starts or a version is built (the entry, weights,
              env, adapters, strategy, build_pace, allow_output_change, ...): the model
              reloads with them in a fresh worker beside the serving one, the way strategy
              respawn reloads; a version that fails leaves the old one serving with the
              old settings
    restart   the session's CPU plan (`cpus`, `threads`) is made once, at start, and a
              build on another `device` would run under the old one's lock and memory
              check: these wait for a restart of `hotreload watch`, and say so

The supervisor runs a reload with new settings as one job (`reload_with`): the model's
state (state.py) holds them on trial, and puts the old ones back unless a worker built
with them serves at its end, or before a restart brings the old worker back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.model.inplace import InPlace
from hotreload.engine.model.jobs import ReloadJob, ReloadOutcome
from hotreload.engine.model.respawn import Respawn

#: The supervisor (supervisor.py imports this module, so it is not named here).
ModelSupervisor = Any

#: The session's CPU plan is made from these at start (engine/cpus.py); a build on another
#: device would run under the old device's lock and memory check.
RESTART_KEYS = frozenset({"name", "cpus", "threads", "device"})
#: Read each time they are used: nothing to rebuild.
LIVE_KEYS = frozenset(
    {
        "max_queue_size",
        "request_timeout_s",
        "max_inflight",
        "deadlines",
        "policy",
        "watch",
        "watch_listed",
        "ignore",
        "recycle",
        "warmup_iters",
        # The engine compares each build's golden outputs (engine/golden.py) with them.
        "expect",
        "tolerance",
        # Read when a version is kept (engine/model/kept_versions.py): fewer drops the oldest then.
        "keep_versions",
        # Read by each build's warm phase (engine/model/phases.py).
        "replay_shapes",
        # The engine's deadline for each eval (engine/model/evals.py).
        "eval_timeout_s",
    }
)


@dataclass(frozen=True)
class Changed:
    """What an edit changed in one model's section, by kind (field names, in order)."""

    live: tuple[str, ...] = ()
    reload: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return self.live + self.reload + self.restart


def classify(old: ModelConfig, new: ModelConfig) -> Changed:
    changed = [f.name for f in fields(new) if getattr(new, f.name) != getattr(old, f.name)]
    return Changed(
        live=tuple(k for k in changed if k in LIVE_KEYS),
        reload=tuple(k for k in changed if k not in LIVE_KEYS | RESTART_KEYS),
        restart=tuple(k for k in changed if k in RESTART_KEYS),
    )


@dataclass(frozen=True)
class Settings:
    """New settings for a reload job: the section and its ignore rules."""

    model: ModelConfig
    ignore: IgnoreRules


def fresh_worker(sup: ModelSupervisor) -> Respawn:
    """The strategy a reload with new settings builds with: a fresh process (the serving
    one was started with the old env, device, adapters), and the old worker stopped after
    the hand-over, never kept as a standby. It takes no standby either (one started with
    the old settings)."""
    return Respawn(sup.st, sup.workers, fresh=True)


Reload = Callable[[ReloadJob, "InPlace | Respawn"], Awaitable[ReloadOutcome]]


async def reload_with(sup: ModelSupervisor, job: ReloadJob, reload: Reload) -> ReloadOutcome:
    """The reload job with `job.settings`: applied, built in a fresh worker, and undone
    unless a worker with them serves. Undone before a restart of the old worker too (it
    died or wedged during the build): that one comes back as it was. The standby goes once
    the new settings serve: it was started with the old ones (the next starts after the job)."""
    sup.st.try_settings(job.settings.model, job.settings.ignore)
    try:
        outcome = await reload(job, fresh_worker(sup))
    finally:
        sup.st.end_trial()
    if sup.model is job.settings.model:  # they serve
        await sup.standby.discard()
    return outcome

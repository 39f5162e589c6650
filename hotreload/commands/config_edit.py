"""An edit of hotreload.toml while `hotreload watch` runs, applied model by model.

Each model's changed settings apply the way engine/model/settings_change.py sorts them:
at once (limits, deadlines, what is watched), by a reload in a fresh worker (entry,
weights, device, env, adapters, ...), or at the next start (`cpus`, `threads`, a model
added or removed, the sections outside `[[models]]`), which the user is told. A reload
with new settings that fails leaves the old version serving with the old settings: the
session's config is the one its models serve with, so the next save of the file is
compared with that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, fields, replace
from typing import Protocol

from hotreload.config import Config, ModelConfig
from hotreload.engine.event_kinds import ConfigChanged
from hotreload.engine.model.settings_change import Settings, classify
from hotreload.engine.session import Session
from hotreload.engine.watcher import FileWatcher


class WatchSession(Protocol):
    """What this module reads of watch_session.WatchSession (which imports it)."""

    config: Config
    session: Session
    watcher: FileWatcher


RESTART = "read at start: restart `hotreload watch` to apply them"


@dataclass
class EditPlan:
    """What an edit changes, and how each part applies."""

    #: Settings applied at once.
    live: list[ModelConfig] = field(default_factory=list)
    #: Models to reload with new settings, and the settings each changed.
    reloads: list[tuple[ModelConfig, tuple[str, ...]]] = field(default_factory=list)
    #: What waits for a restart: `mlp: cpus`, `model added: gpt2`, `watch`.
    waiting: list[str] = field(default_factory=list)
    #: One phrase per part, in the config's order.
    said: list[str] = field(default_factory=list)

    def message(self, file: str) -> str:
        parts = [*self.said]
        if self.waiting:
            parts.append(f"{', '.join(self.waiting)}: {RESTART}")
        return f"{file} changed: {'; '.join(parts) or 'no setting'}"


def plan_edit(old: Config, new: Config) -> EditPlan:
    """How `new` (the file as saved now) applies over `old` (what the session serves with)."""
    plan = EditPlan()
    before = {m.name: m for m in old.models}
    after = {m.name for m in new.models}
    for m in new.models:
        if m.name not in before:
            plan.waiting.append(f"model added: {m.name}")
            continue
        changed = classify(before[m.name], m)
        if not changed.keys:
            continue
        keys = ", ".join(changed.keys)
        if changed.restart:  # the whole section waits: half of an edit applied misleads
            plan.waiting.append(f"{m.name}: {keys}")
        elif changed.reload:
            plan.said.append(f"{m.name} ({keys}) reloads with them")
            plan.reloads.append((m, changed.keys))
        else:
            plan.said.append(f"{m.name} ({keys}): applied, nothing to rebuild")
            plan.live.append(m)
    plan.waiting += [f"model removed: {n}" for n in before if n not in after]
    plan.waiting += [
        f.name
        for f in fields(new)
        if f.name not in ("models", "http") and getattr(new, f.name) != getattr(old, f.name)
    ]
    return plan


async def apply_edit(ws: WatchSession, new: Config) -> frozenset[str]:
    """Apply the saved file over what the session serves, and say what became of it;
    returns the models built anew with it."""
    plan = plan_edit(ws.config, new)
    ws.session.events.emit(ConfigChanged(detail=plan.message(ws.config.path.name)))
    for m in plan.live:
        s = _settings(ws, m)
        ws.session.models[m.name].use_settings(s)
        await _serving_with(ws, m)
    built = await asyncio.gather(*(_reload(ws, m, keys) for m, keys in plan.reloads))
    return frozenset(m.name for (m, _), ok in zip(plan.reloads, built, strict=True) if ok)


async def _reload(ws: WatchSession, m: ModelConfig, keys: tuple[str, ...]) -> bool:
    detail = [f"{ws.config.path.name}: {', '.join(keys)}"]
    outcome = await ws.session.models[m.name].reload("config", detail, settings=_settings(ws, m))
    if outcome.ok:
        await _serving_with(ws, m)
        return True
    ws.session.events.emit(
        ConfigChanged(
            detail=f"{m.name}'s new settings failed in {outcome.phase or 'the reload'}: "
            f"{outcome.error}; v{outcome.version} serves on with the settings before; fix "
            f"{ws.config.path.name} and save it again"
        )
    )
    return False


def _settings(ws: WatchSession, m: ModelConfig) -> Settings:
    return Settings(m, ws.session.ignore_rules(m.ignore))


async def _serving_with(ws: WatchSession, m: ModelConfig) -> None:
    """`m` is what the model serves with now: the session's config and the watcher's
    routes follow."""
    models = tuple(m if x.name == m.name else x for x in ws.config.models)
    ws.config = ws.session.config = replace(ws.config, models=models)
    await ws.watcher.use_config(ws.config)

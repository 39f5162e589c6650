"""An adapter save (or an adapter push) as the next version, without building the base.

When the code was not re-imported and the base is unchanged, the next version is the
serving module copied as a structure (`structure_copy`: no tensor copied), with the saved
adapter's tensors loaded into the copy by peft's `set_peft_model_state_dict` (assigned: the
serving version's stay untouched). It costs the module count and the adapter's bytes: no
factory call, no peft injection, no base read, whatever the base weighs.

Anything else (an adapter's config changed, adapters added or removed, one a restart left
out, a push holding base tensors) returns None: the ordinary build runs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hotreload.worker import adapter_pushes
from hotreload.worker.adapters import (
    WEIGHTS_FILE,
    AdapterSet,
    ServedAdapter,
    _load,
    _read,
    _stamp,
    adapter_digest,
    config_text,
    lay_pushes,
    lora_layers,
)
from hotreload.worker.weight_sources import PlacedWeights


def _only_adapter_tensors(
    overlays: Sequence[Mapping[str, Any]], held: AdapterSet, declared: list[str], spec: Any
) -> bool:
    """Every tensor of these pushes is an adapter's."""
    default, prefix = spec.get("default_adapter"), spec.get("weights_prefix")
    for o in overlays:
        try:
            ours = adapter_pushes.adapter_entries(o, held.base_state, declared, default, prefix)
        except Exception:
            return False  # the ordinary build says what is wrong with it
        if len(ours) != len(o["state"].get("tensors", [])):
            return False
    return True


def copied(
    spec: Mapping[str, Any],
    current: Any,
    overlays: Sequence[Mapping[str, Any]],
    device: torch.device,
) -> tuple[torch.nn.Module, PlacedWeights] | None:
    """The next version's module and weights, copied from `current`, or None when it
    cannot be had that way."""
    held = getattr(getattr(current, "weights", None), "adapters", None)
    specs = list(spec.get("adapters") or ())
    model = getattr(current, "model", None)
    folders = {str(s["name"]): Path(str(s["folder"])) for s in specs}
    if held is None or not isinstance(model, torch.nn.Module) or current.on_host:
        return None
    if list(folders) != list(held.adapters) or held.unavailable:
        return None
    seen = set(current.weights.overlay_ids)
    new = [o for o in overlays if int(o["id"]) not in seen]
    if not _only_adapter_tensors(new, held, list(folders), spec):
        return None
    if any(config_text(f) != held.adapters[n].config for n, f in folders.items()):
        return None  # a changed adapter_config.json may change the layers themselves
    clone = structure_copy(model, {})
    prefix = spec.get("weights_prefix")
    served: dict[str, ServedAdapter] = {}
    for name, folder in folders.items():
        old, stamp = held.adapters[name], _stamp(folder)
        if stamp == old.stamp:
            served[name] = replace(old, folder=str(folder), source="shared")
            continue
        # The folder the spec names now: after a restart the serving version read its copy
        # in the last good snapshot, and the save is of the live one.
        state = adapter_pushes.file_state(_read(folder / WEIGHTS_FILE, name), prefix)
        if not _complete(_load(clone, state, name, WEIGHTS_FILE), old.keys):
            return None  # the ordinary build reports the tensors the file misses
        served[name] = replace(old, folder=str(folder), stamp=stamp, source="file")
    _, pushed = adapter_pushes.split(
        new, set(held.base_state), specs, spec.get("default_adapter"), prefix, device
    )
    lay_pushes(clone, pushed, served)
    layers = lora_layers(clone)
    for name, adapter in served.items():
        if adapter.source != "shared":
            adapter.digest = adapter_digest(clone, name)
    aset = AdapterSet(
        served, held.default, held.base_state, held.base_digest, [m for _, m in layers]
    )
    aset.select(held.default)
    placed = PlacedWeights(
        keys=set(current.weights.keys),
        overlay_ids=tuple(sorted(seen | {int(o["id"]) for o in new})),
        reused=len(held.base_state),
        adapters=aset,
    )
    return clone, placed


def structure_copy(module: torch.nn.Module, done: dict[int, Any]) -> Any:
    """A new module object for `module` and each submodule, with the same tensors and
    attributes but its own `_parameters`, `_buffers` and `_modules` tables: assigning a
    tensor or switching an adapter in the copy leaves the original as it is. A shared
    submodule stays shared (`done`); 10 us a module, whatever its tensors weigh."""
    if id(module) in done:
        return done[id(module)]
    clone = copy.copy(module)
    done[id(module)] = clone
    clone.__dict__["_parameters"] = dict(module._parameters)
    clone.__dict__["_buffers"] = dict(module._buffers)
    clone.__dict__["_modules"] = {
        k: None if m is None else structure_copy(m, done) for k, m in module._modules.items()
    }
    return clone


def _complete(result: Any, keys: Sequence[str]) -> bool:
    """Whether a load set every one of an adapter's tensors."""
    return not set(getattr(result, "missing_keys", ())) & set(keys)

"""A push's next version without calling build(): the serving module, copied as a structure.

A push changes weights only, so build() would make the module the serving version already
is, and calling it is most of what a push costs the serving worker (a Hugging Face model's
constructor runs Python over every layer, under the serving interpreter's lock). The copy
(`adapter_copy.structure_copy`, ~10 us a module) gets every weight tensor assigned by
`place_weights`: each parameter is a new `Parameter` of its own, so the serving version's
stay as they are and a later `.to()` of one version cannot move the other's.

Not taken (build() runs) for TorchScript, declared adapters (adapter_copy.py), a serving
version offloaded or built with some files changed, torch swapping tensors in place on
assignment (`set_swap_module_params_on_conversion`: the swap would reach the serving
tensors), or a module holding a way back to the serving modules the copy cannot redirect:
`torch.compile`'s wrapper, a bound method of a module kept as an attribute, a hook, a
parametrization (which refuses to be copied).
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hotreload.worker.adapter_copy import structure_copy


def structure_for_push(
    spec: Mapping[str, Any],
    current: Any,
    overlays: Sequence[Mapping[str, Any]],
    unchanged: Sequence[int] | None,
) -> torch.nn.Module | None:
    """The serving module's structure for the next version, or None (call build())."""
    model = getattr(current, "model", None)
    if not isinstance(model, torch.nn.Module) or getattr(current, "on_host", False):
        return None
    if spec["entry"].get("torchscript") or spec.get("adapters") or unchanged is not None:
        return None
    if torch.__future__.get_swap_module_params_on_conversion():
        return None
    if not current.weights.keys:
        return None  # build() set the weights itself: nothing to share them from
    seen = set(current.weights.overlay_ids)
    if not any(int(o["id"]) not in seen for o in overlays):
        return None  # no new push: not a push's build
    if not all(map(_redirectable, model.modules())):
        return None
    try:
        clone = structure_copy(model, {})
    except Exception:
        return None  # a module that refuses copy.copy: build() makes the version
    for mine in clone.modules():
        # Buffers outside the state dict (a rotary `inv_freq`, a cache a forward writes in
        # place) get no tensor assigned: each version has its own, as build() would give.
        for name in mine._non_persistent_buffers_set:
            buf = mine._buffers.get(name)
            if buf is not None:
                mine._buffers[name] = buf.clone()
    return clone


#: A module's tables of hooks that run in its forward (functions the copy would share).
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
#: The tables structure_copy gives the copy of its own.
_OWN = ("_parameters", "_buffers", "_modules")


def _redirectable(module: torch.nn.Module) -> bool:
    """Does a copy of `module` (its tables its own, every other attribute shared) compute
    with the copy's tensors? Not when something it calls is bound to the original."""
    if type(module).__name__ == "OptimizedModule":  # torch.compile's wrapper
        return False
    if any(getattr(module, name, None) for name in _HOOKS):
        return False
    if isinstance(getattr(module, "parametrizations", None), torch.nn.ModuleDict):
        return False  # torch.nn.utils.parametrize: its class and properties are per object
    for key, value in vars(module).items():
        if key in _OWN or key in _HOOKS:
            continue
        if isinstance(value, types.MethodType) and isinstance(value.__self__, torch.nn.Module):
            return False
    return True

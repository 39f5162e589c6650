"""Weights of a `torch.compile`d model, named as the eager model names them.

`torch.compile(module)` returns a wrapper whose state dict puts `_orig_mod.` in front of
every name, while checkpoints are saved from the eager module (or from a compiled trainer
model, with the prefix). The wrapper and the module inside share their parameters, so a
version's weights are placed, shared, mapped, pushed and digested on the module inside:
eager names fit as they are, `_orig_mod.` names (a compiled model's checkpoint or push)
have it stripped, and no `weights_prefix` is written by hand. Assigning into that module
leaves the compiled graphs valid: dynamo guards on the parameters' shapes, dtypes and
devices, never on their values, so a weights change compiles nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: What torch.compile's wrapper puts in front of every name of the module it wraps.
ORIG = "_orig_mod."


def is_compiled(model: Any) -> bool:
    return type(model).__name__ == "OptimizedModule" and isinstance(
        getattr(model, "_orig_mod", None), torch.nn.Module
    )


def unwrap(model: Any) -> Any:
    """The eager module a compiled wrapper (or several) holds; anything else as it is."""
    while is_compiled(model):
        model = model._orig_mod
    return model


def prefix_for(model: Any, prefix: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """`weights_prefix` as it applies to `unwrap(model)`: none given, `_orig_mod.` is
    stripped where a name has it (a compiled model's checkpoint or push); one written for
    the wrapper (`add = "_orig_mod."`, as the start-up error used to ask) loses that part;
    any other (a `strip` of the user's) has `_orig_mod.` stripped first too, so a compiled
    model's checkpoint loads with the same setting as the eager one's."""
    if not is_compiled(model):
        return prefix
    if not prefix:
        return {"strip": ORIG, "add": ""}
    add = prefix.get("add", "")
    if add.startswith(ORIG):
        return {**prefix, "add": add[len(ORIG) :]}
    return {**prefix, "strip_first": ORIG}


def eager_names(names: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping whose keys are the wrapper's names, keyed by the module's inside."""
    return {k[len(ORIG) :] if k.startswith(ORIG) else k: v for k, v in names.items()}


def has_compiled(model: Any) -> bool:
    """`model` or a module inside it is a torch.compile wrapper."""
    if is_compiled(model):
        return True
    return isinstance(model, torch.nn.Module) and any(map(is_compiled, model.modules()))

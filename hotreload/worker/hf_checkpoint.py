"""Hugging Face checkpoints read as `from_pretrained` reads them.

transformers 5 renames and fuses weights between a checkpoint and the module (ViT's
`attention.attention.key` is `attention.k_proj`; Mixtral's per-expert `experts.N.w1.weight`
are one fused `experts.gate_up_proj`): `save_pretrained` writes the original names and
`from_pretrained` converts them back. A factory that builds the model from its config and
declares the saved file as `weights` needs the same conversion, so it runs transformers'
own (`get_model_conversion_mapping`, `rename_source_key`, each `WeightConverter`), as
`convert_and_load_state_dict_in_model` does, but returns a state dict for the strict load
(weights.py): ties, the assigning load, the shared block and the checks stay one path.
Nothing here imports transformers unless the factory did.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import torch


def hf_models(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """(path, module) of each outermost `PreTrainedModel` in `model` (path "" when the
    factory returned one itself; a wrapper's attribute path otherwise)."""
    if "transformers" not in sys.modules:
        return []
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return [("", model)]
    found: list[tuple[str, Any]] = []
    for path, sub in model.named_modules():
        if isinstance(sub, PreTrainedModel) and not any(path.startswith(p + ".") for p, _ in found):
            found.append((path, sub))
    return found


@dataclass
class ModuleState:
    """A checkpoint's tensors under the module's names."""

    tensors: dict[str, torch.Tensor]
    #: Each module key -> the checkpoint keys it was made from (a fused tensor: several).
    sources: dict[str, set[str]]
    #: What transformers' conversion did, for messages (None: it did not run).
    converted: str | None = None


def _convert_one(
    hf: Any, state: Mapping[str, torch.Tensor], sources: dict[str, set[str]]
) -> dict[str, torch.Tensor]:
    """`state` (checkpoint names) in `hf`'s names, by transformers' conversion for it;
    `sources` gets the checkpoint keys of each. A key no transform can place is kept as it
    is (the strict load names it)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    mapping = get_model_conversion_mapping(hf)
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    # Names and shapes only (no tensor is read from it): the targets a key may rename to.
    own = hf.state_dict()
    prefix = hf.base_model_prefix
    todo: dict[str, Any] = {}
    out: dict[str, torch.Tensor] = {}
    # The order from_pretrained collects in: a fused tensor stacks experts 0, 1, ..., 10.
    for key, tensor in sorted(state.items(), key=lambda kv: dot_natural_key(kv[0])):
        target, pattern = rename_source_key(key, renamings, converters, prefix, own)
        if target not in own and key in own:
            target, pattern = rename_source_key(key, [], [], prefix, own)
        if target not in own:
            out[key] = tensor  # unexpected: reported by the strict load, under its own name
            sources[key] = {key}
            continue
        if pattern is not None:
            transform = todo.setdefault(target, deepcopy(by_pattern[pattern]))
        else:
            transform = todo.setdefault(target, WeightRenaming(key, target))
            pattern = key
        transform.add_tensor(target, key, pattern, tensor)
    for first, transform in todo.items():
        # Read before convert(): one source key may make several targets (a split qkv).
        made_from = set().union(*transform.layer_targets.values())
        for name, value in transform.convert(first, model=hf, config=hf.config).items():
            out[name] = value[0] if isinstance(value, list) else value
            sources[name] = made_from
    return out


def to_module_keys(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], module_keys: set[str]
) -> ModuleState:
    """`state` (after `weights_prefix`) with every Hugging Face submodule's checkpoint names
    converted to its module names.

    A state whose names are the module's already (a plain `state_dict()` save, or
    `save_original_format=False`) is returned as it is, without building transformers'
    mapping (~50 ms): for those names from_pretrained's renaming ends where it started."""
    same = ModuleState(dict(state), {k: {k} for k in state})
    if set(state) <= module_keys:
        return same
    models = hf_models(model)
    if not models:
        return same
    done: list[str] = []
    for path, hf in models:
        head = path + "." if path else ""
        part = {k[len(head) :]: t for k, t in state.items() if k.startswith(head)}
        if not part:
            continue
        for k in part:
            del same.tensors[head + k], same.sources[head + k]
        sources: dict[str, set[str]] = {}
        converted = _convert_one(hf, part, sources)
        same.tensors.update({head + k: t for k, t in converted.items()})
        same.sources.update({head + k: {head + s for s in v} for k, v in sources.items()})
        what = f"{len(part)} checkpoint tensor(s) into {len(converted)}"
        done.append(f"{type(hf).__name__}{' at ' + path if path else ''}: {what}")
    same.converted = "; ".join(done) or None
    return same

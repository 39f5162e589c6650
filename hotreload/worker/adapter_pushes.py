"""Adapter tensors in a push, and adapter files' keys, as peft's loader takes them.

A push may name an adapter tensor as a trainer's peft model holds it
(`base_model.model.<path>.lora_A.default.weight`), as peft's `save_pretrained` writes it
(`base_model.model.<path>.lora_A.weight`) or as the served module holds it
(`<path>.lora_A.<adapter>.weight`). All three come to the form `set_peft_model_state_dict`
reads (the adapter's name taken out, `weights_prefix` applied as for a weights file),
grouped by adapter: the one a name carries, else (peft's "default", or none) the model's
default adapter. The rest of a push (base tensors) goes on as before (weight_sources.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from hotreload.worker.load_error import LoadError
from hotreload.worker.pushed_state import read_state
from hotreload.worker.weights import apply_prefix

#: The prefix peft's PeftModel puts before the base model's names.
PEFT_PREFIX = "base_model.model."
#: peft's name of the adapter a `get_peft_model` call makes.
PEFT_DEFAULT = "default"


def _layer_names() -> frozenset[str]:
    from peft.tuners.lora.layer import LoraLayer

    return frozenset(LoraLayer.adapter_layer_names)


def peft_form(
    name: str, declared: Sequence[str], default: str | None, prefix: Mapping[str, str] | None
) -> tuple[str, str] | None:
    """(adapter, name as peft's loader reads it) for an adapter tensor's name; None for a
    name that holds no LoRA layer's tensor (a base tensor)."""
    layer_names = _layer_names()
    parts = name.removeprefix(PEFT_PREFIX).split(".")
    at = next((i for i, p in enumerate(parts) if p in layer_names), None)
    if at is None:
        return None
    adapter = default
    if at + 1 < len(parts) and (parts[at + 1] in declared or parts[at + 1] == PEFT_DEFAULT):
        if parts[at + 1] != PEFT_DEFAULT:
            adapter = parts[at + 1]
        del parts[at + 1]
    if adapter is None or adapter not in declared:
        raise LoadError(
            f"pushed adapter tensor {name} names no adapter and the model's default is the "
            f"base; name the adapter in it (`...{parts[at]}.<adapter>...`, one of "
            f"{', '.join(declared)})"
        )
    mapped = apply_prefix([".".join(parts)], prefix)
    return adapter, next(iter(mapped.values()))


def file_state(
    state: Mapping[str, torch.Tensor], prefix: Mapping[str, str] | None
) -> dict[str, torch.Tensor]:
    """An adapter file's tensors with `weights_prefix` applied (the factory wraps the model
    the adapter was trained on, as for its weights file); names otherwise as peft wrote them."""
    if not prefix:
        return dict(state)
    mapping = apply_prefix([k.removeprefix(PEFT_PREFIX) for k in state], prefix)
    return {mapping[k.removeprefix(PEFT_PREFIX)]: t for k, t in state.items()}


def adapter_entries(
    overlay: Mapping[str, Any],
    base_names: Collection[str],
    declared: Sequence[str],
    default: str | None,
    prefix: Mapping[str, str] | None,
) -> dict[str, tuple[str, str]]:
    """Pushed name -> `peft_form` of each tensor of a push that is an adapter's, judged by
    name before a byte is read (a CUDA IPC tensor can be read once only)."""
    fallback = default if default in declared else None
    ours: dict[str, tuple[str, str]] = {}
    for e in overlay["state"].get("tensors", []):
        mapped = next(iter(apply_prefix([e["name"]], prefix).values()))
        if e["name"] in base_names or mapped in base_names:
            continue
        form = peft_form(e["name"], declared, fallback, prefix)
        if form is not None:
            ours[e["name"]] = form
    return ours


def split(
    overlays: Sequence[Mapping[str, Any]],
    base_names: set[str],
    specs: Sequence[Mapping[str, Any]],
    default: str | None,
    prefix: Mapping[str, str] | None,
    device: torch.device,
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, dict[str, torch.Tensor]]]]]:
    """Each push split in two: its base tensors (a push of their own, same id and strict),
    and its adapter tensors read now, grouped by adapter. A push that holds no base tensor
    leaves no base part: `strict` then asks nothing of the base."""
    declared = [str(s["name"]) for s in specs]
    base_parts: list[dict[str, Any]] = []
    adapter_parts: list[tuple[int, dict[str, dict[str, torch.Tensor]]]] = []
    for overlay in overlays:
        entries = overlay["state"].get("tensors", [])
        ours = adapter_entries(overlay, base_names, declared, default, prefix)
        rest = [e for e in entries if e["name"] not in ours]
        if rest or not ours:
            base_parts.append({**overlay, "state": {**overlay["state"], "tensors": rest}})
        if ours:
            picked = [e for e in entries if e["name"] in ours]
            tensors = read_state({**overlay["state"], "tensors": picked}, "cpu")
            groups: dict[str, dict[str, torch.Tensor]] = {}
            for raw, t in tensors.items():
                adapter, name = ours[raw]
                groups.setdefault(adapter, {})[name] = t
            adapter_parts.append((int(overlay["id"]), groups))
    return base_parts, adapter_parts

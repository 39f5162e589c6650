"""`hotreload save MODEL DIR`: the serving version's weights written to a folder.

A torch module's `state_dict()` goes into `model.safetensors` under the module's own names
(those `load_state_dict` takes; pushed tensors included: they are the module's now), with
the weights digest, version and model name in its metadata; a Hugging Face model (one with
`save_pretrained` and a `config`) writes its own folder, which `from_pretrained` loads.
`hotreload.json` beside them names the digest: `state_digest(load_file(...))` of a plain
save equals it (worker/weights_digest.py). Files are written under a temporary name and
renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from hotreload.protocol.messages import SaveReply
from hotreload.worker import compiled_names
from hotreload.worker.load_error import LoadError

#: The plain save's file; a Hugging Face model's own save writes the same name.
WEIGHTS_FILE = "model.safetensors"
#: What was saved, by whom, and its digest.
RECORD_FILE = "hotreload.json"


def _plain_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every state entry as a CPU tensor safetensors can hold; an entry sharing memory with
    an earlier one (tied weights, or a view of part of it: a slice of a fused qkv) is
    copied, so each name keeps its own tensor. Keyed by the storage, not (pointer, size):
    safetensors refuses any two entries in one storage, overlapping or not."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor) or value.is_quantized:
            raise LoadError(
                f"state entry {name!r} is not a plain tensor ({type(value).__name__}"
                f"{', quantized' if isinstance(value, torch.Tensor) else ''}): safetensors "
                "cannot hold it; save this model with its own code"
            )
        t = value.detach().to("cpu").contiguous()
        key = t.untyped_storage().data_ptr()
        if t.nbytes and key in seen:
            t = t.clone()
        seen.add(key)
        out[name] = t
    return out


def _pretrained(model: Any) -> bool:
    """A Hugging Face model: it saves a folder `from_pretrained` reads (config included).
    A peft-wrapped one is saved as its state dict (its adapters' names included)."""
    return (
        hasattr(model, "save_pretrained")
        and hasattr(model, "config")
        and not hasattr(model, "peft_config")
    )


def save_version(
    model: Any, version: int, folder: Path, *, name: str, digest: str | None
) -> SaveReply:
    """Write `model`'s weights (the serving version `version`) into `folder`. A compiled
    model's are the eager module's, under its names (no `_orig_mod.`): what the eager
    module, and this model's own `weights`, load."""
    model = compiled_names.unwrap(model)
    if not isinstance(model, torch.nn.Module):
        raise LoadError(
            f"the factory returned {type(model).__name__}, not a torch.nn.Module: there is "
            "no state dict to save"
        )
    if folder.exists() and not folder.is_dir():
        raise LoadError(f"{folder} is a file; name a folder to save into")
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"model": name, "version": str(version), "digest": digest or ""}
    if _pretrained(model):
        model.save_pretrained(str(folder), safe_serialization=True)
        files = sorted(_hf(folder))
        state = model.state_dict()
        tensors, size = len(state), sum(t.nbytes for t in state.values())
        pretrained = True
    else:
        from safetensors.torch import save_file

        plain = _plain_state(model)
        tmp = folder / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
        try:
            save_file(plain, str(tmp), metadata={"format": "pt", **_prefixed(meta)})
            os.replace(tmp, folder / WEIGHTS_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        files, tensors = [WEIGHTS_FILE], len(plain)
        size, pretrained = sum(t.nbytes for t in plain.values()), False
    record = {**meta, "version": version, "files": files, "tensors": tensors, "bytes": size}
    tmp = folder / f".{RECORD_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, folder / RECORD_FILE)
    return SaveReply([*files, RECORD_FILE], tensors, size, pretrained)


def _prefixed(meta: dict[str, str]) -> dict[str, str]:
    return {f"hotreload_{k}": v for k, v in meta.items()}


def _hf(folder: Path) -> set[str]:
    """The files a Hugging Face save writes (rewritten when they were there before)."""
    return {
        f
        for f in os.listdir(folder)
        if f.endswith((".safetensors", ".json")) and f != RECORD_FILE and not f.startswith(".")
    }

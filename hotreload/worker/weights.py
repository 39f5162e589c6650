"""Weights files into the module a factory built, and TorchScript archives as models.

Files are read the safe ways only: safetensors, or `torch.load(weights_only=True)`, which
never runs code from the file. The load is strict, with the allowances the usual ways of
saving a model need:

- tied parameters (`lm_head.weight` *is* `embed_tokens.weight`): `save_pretrained` and
  `safetensors.torch.save_model` store one name of each tied group; the one stored loads
  into every name of its group;
- `weights_prefix`: the file's keys lack (or carry) a prefix the module's have not, as
  when the factory wraps the model; a mismatch by a prefix alone suggests the exact line;
- a Hugging Face model's checkpoint names (renamed, or experts saved one by one), converted
  to the module's by transformers' own conversion, as `from_pretrained` does
  (hf_checkpoint.py).

A file that cannot be a state dict (a TorchScript archive, a pickled whole module) is
refused in one sentence that says what to do instead, not torch's page of advice.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hotreload.config.weights import is_torchscript_archive
from hotreload.worker.fast_build import owned_tensors, retie
from hotreload.worker.hf_checkpoint import to_module_keys
from hotreload.worker.load_error import LoadError
from hotreload.worker.shared_weights import SharedBlock

# ----------------------------------------------------------------------------- TorchScript


def torchscript_factory(entry: Mapping[str, Any]) -> Callable[[], Any] | None:
    """A factory loading the entry's TorchScript archive, or None for a Python entry."""
    if not entry.get("torchscript"):
        return None
    path = Path(str(entry["file"]))

    def load() -> Any:
        if not path.is_file():
            raise LoadError(f"{entry['spec']}: file {path} no longer exists")
        try:
            with warnings.catch_warnings():
                # torch 2.13 deprecates TorchScript; serving an archive one has is the point.
                warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated")
                # On the CPU first: build_version moves it to its device like any module.
                return torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise LoadError(
                f"{entry['spec']}: cannot load {path.name} as a TorchScript archive "
                f"(torch.jit.save): {exc}"
            ) from None

    return load


# ----------------------------------------------------------------------------- reading


def _pickle_globals(path: Path) -> list[str]:
    """`module.name` of each class or function a torch.save file's pickle refers to, read
    from its opcodes: nothing in the file is run or imported."""
    names: list[str] = []
    strings: list[str] = []
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                data = next((n for n in zf.namelist() if n.endswith("/data.pkl")), None)
                streams = [io.BytesIO(zf.read(data))] if data else []
        else:
            # The legacy format, four pickles in a row (magic number, protocol, system
            # info, the object): one stream, read a pickle at a time.
            streams = [io.BytesIO(path.read_bytes())] * 4
        for stream in streams:
            for op, arg, _ in pickletools.genops(stream):
                if op.name == "GLOBAL":
                    names.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
    except (OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError):
        pass  # a damaged pickle: the caller reports torch's own reason
    return names


def _unpickling_refused(path: Path, shown: str, exc: Exception) -> LoadError:
    found = _pickle_globals(path)
    if any(n.startswith("torch.nn.modules.") or n.endswith("._rebuild_parameter") for n in found):
        return LoadError(
            f"weights file {shown} holds a pickled whole module (torch.save(model)), which a "
            f"safe load refuses; save its weights instead: torch.save(model.state_dict(), "
            f"{shown!r})"
        )
    # Torch's message is a page of advice on running the file's code; keep what it refused.
    refused = [n for n in found if not n.startswith(("torch.", "collections."))]
    what = f" ({', '.join(dict.fromkeys(refused))})" if refused else ""
    return LoadError(
        f"weights file {shown} holds pickled Python objects{what} that a safe load refuses "
        f"(unpickling them could run code); save tensors only: a state dict "
        f"(torch.save(model.state_dict(), path)) or a .safetensors file"
        + ("" if found else f" (torch said: {str(exc).splitlines()[0][:200]})")
    )


def _read(path: Path, root: str | None, device: str = "cpu") -> dict[str, torch.Tensor]:
    shown = os.path.relpath(path, root) if root else str(path)
    if not path.is_file():
        raise LoadError(f"weights file {path} does not exist")
    if path.suffix != ".safetensors" and is_torchscript_archive(path):
        raise LoadError(
            f"weights file {shown} is a TorchScript archive (torch.jit.save), not a state "
            f'dict; serve it as the model instead: entry = "{shown}", and take it out of '
            "`weights`"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            part: Any = load_file(str(path), device=device)
        else:
            # weights_only: a checkpoint must never be able to run code on load.
            part = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _unpickling_refused(path, shown, exc) from None
    except Exception as exc:
        raise LoadError(f"cannot read weights file {shown}: {exc}") from None
    if isinstance(part, dict) and isinstance(part.get("state_dict"), dict):
        part = part["state_dict"]
    if not isinstance(part, dict):
        raise LoadError(f"weights file {shown} holds {type(part).__name__}, not a state dict")
    return part


# ----------------------------------------------------------------------------- key mapping


def apply_prefix(keys: Iterable[str], prefix: Mapping[str, str] | None) -> dict[str, str]:
    """File key -> module key: `strip` removed where a key starts with it, then `add` put in
    front of every key. `strip_first` (compiled_names.prefix_for: `_orig_mod.`) is removed
    before `strip`, where a key starts with it."""
    strip = (prefix or {}).get("strip", "")
    add = (prefix or {}).get("add", "")
    first = (prefix or {}).get("strip_first", "")
    out = {}
    for key in keys:
        k = key[len(first) :] if first and key.startswith(first) else key
        out[key] = add + (k[len(strip) :] if strip and k.startswith(strip) else k)
    return out


def packed_entries(state: Mapping[str, Any]) -> list[str]:
    """Keys of a state dict whose value is not a plain tensor: a quantized layer's (its
    packed parameters hold a dtype and a tuple of tensors; its weight is a quantized
    tensor, which neither a view nor an assignment keeps packed)."""
    return [k for k, t in state.items() if not isinstance(t, torch.Tensor) or t.is_quantized]


def tied_groups(model: torch.nn.Module) -> dict[str, frozenset[str]]:
    """Each state-dict key of a tensor shared with other keys -> every key sharing it.

    Shared means the same storage seen the same way (address, shape, strides, dtype): the
    same Parameter under two names (Hugging Face's tie_weights), or two views of one block.
    """
    by_view: dict[tuple[Any, ...], set[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue  # a quantized layer's packed parameters: a dtype, a tuple
        if t.numel() == 0 or t.device.type == "meta":
            continue  # no storage to share: address 0 for every one of them
        key = (t.device, t.dtype, tuple(t.shape), t.stride(), t.data_ptr())
        by_view.setdefault(key, set()).add(name)
    return {n: frozenset(g) for g in by_view.values() if len(g) > 1 for n in g}


def _problems(
    module_keys: set[str], loaded: set[str], ties: Mapping[str, frozenset[str]]
) -> tuple[list[str], list[str]]:
    """(missing, unexpected) module keys: a missing key one of whose tied names loaded is
    not missing (it shares that tensor)."""
    missing = sorted(k for k in module_keys - loaded if not (ties.get(k, frozenset()) & loaded))
    return missing, sorted(loaded - module_keys)


def _dotted_suffix(a: str, b: str) -> str:
    """The longest common suffix of two keys made of whole dotted parts."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    return ".".join(pa[len(pa) - n :]) if n else ""


def suggest_prefix(
    file_keys: Sequence[str], module_keys: set[str], ties: Mapping[str, frozenset[str]]
) -> dict[str, str] | None:
    """The (strip, add) under which the file's keys match the module's exactly, when the
    two differ by a prefix alone; None when no prefix makes them match."""
    raw = set(file_keys)
    only_module = sorted(module_keys - raw)[:8]
    only_file = sorted(raw - module_keys)[:8]
    for m in only_module or sorted(module_keys)[:1]:
        for f in only_file or sorted(raw)[:1]:
            common = _dotted_suffix(m, f)
            if not common:
                continue
            candidate = {"strip": f[: len(f) - len(common)], "add": m[: len(m) - len(common)]}
            loaded = set(apply_prefix(raw, candidate).values())
            if (candidate["strip"] or candidate["add"]) and _problems(
                module_keys, loaded, ties
            ) == ([], []):
                return candidate
    return None


def prefix_line(prefix: Mapping[str, str]) -> str:
    """The config line that sets `prefix`."""
    if not prefix.get("strip"):
        return f'weights_prefix = "{prefix["add"]}"'
    parts = [f'strip = "{prefix["strip"]}"'] + (
        [f'add = "{prefix["add"]}"'] if prefix.get("add") else []
    )
    return "weights_prefix = { " + ", ".join(parts) + " }"


# ----------------------------------------------------------------------------- loading


def load_weights(
    model: Any,
    files: Sequence[str],
    prefix: Mapping[str, str] | None = None,
    *,
    root: str | None = None,
    assign: bool = False,
    device: torch.device | None = None,
    shared: bool = False,
    elsewhere: set[str] | None = None,
    by_file: list[set[str]] | None = None,
) -> SharedBlock | None:
    """Load the weights `files` into `model` strictly, tied parameters and `prefix` allowed
    for. `root` (the project folder) shortens the paths in messages. `assign`: the file's
    tensors become the parameters (no copy; see fast_build.py). `device`: a CUDA device the
    files are read straight onto (no host copy of the whole state). With `shared` (and
    `assign`), host weights go into a shared block, returned (its owner closes it).
    `elsewhere`: module keys the caller fills from elsewhere (shards it did not read), not
    missing. `by_file` gets, per file, the module keys made from it."""
    if not files:
        return None
    if not isinstance(model, torch.nn.Module):
        raise LoadError(
            f"weights are configured but the factory returned {type(model).__name__}, "
            "not a torch.nn.Module; load the weights inside the factory or remove `weights`"
        )
    state: dict[str, torch.Tensor] = {}
    file_of: dict[str, int] = {}
    target = str(device) if device is not None and device.type == "cuda" else "cpu"
    for i, name in enumerate(files):
        part = _read(Path(name), root, target)
        file_of.update(dict.fromkeys(part, i))
        state.update(part)
    mapping = apply_prefix(state, prefix)
    module_keys = set(model.state_dict(keep_vars=True))
    converted = to_module_keys(model, {mapping[k]: v for k, v in state.items()}, module_keys)
    mapped = converted.tensors
    ties = tied_groups(model)
    missing, unexpected = _problems(module_keys, set(mapped) | (elsewhere or set()), ties)
    if missing or unexpected:
        text = _mismatch(
            missing, unexpected, list(state), module_keys, ties, prefix, converted.converted
        )
        packed = packed_entries(model.state_dict(keep_vars=True))
        if packed and set(packed) & set(missing):
            text += (
                f" (build() returns a quantized module: {packed[0]} is packed; save the "
                "weights of the quantized module, torch.save(model.state_dict(), path), or "
                "load the float weights inside build() before quantizing and remove `weights`)"
            )
        raise LoadError(text)
    if by_file is not None:
        by_file[:] = _keys_by_file(converted.sources, file_of, mapping, ties, len(files))
    _check_tied_values(mapped, ties)
    block = None
    # A quantized layer's packed parameters load through its own _load_from_state_dict,
    # which repacks them: copied in, not assigned.
    packed = bool(packed_entries(mapped))
    try:
        if assign and not packed:
            fresh = _made_fresh(state, mapped)
            owned, block = owned_tensors(model, mapped, shared=shared, fresh=fresh)
            model.load_state_dict(owned, strict=False, assign=True)
            retie(model, ties, set(mapped))
        elif packed:
            # Its layout version rides on the state dict (quantized Linear: version 3 packs
            # weight and bias in one tuple); the keys matched the module's, so its own.
            own = collections.OrderedDict(mapped)
            own._metadata = getattr(model.state_dict(), "_metadata", None)  # type: ignore[attr-defined]
            model.load_state_dict(own, strict=False)
        else:
            model.load_state_dict(mapped, strict=False)
    except RuntimeError as exc:  # size mismatches
        if block is not None:
            block.close()
        raise LoadError(
            f"weights do not match the model: {exc}; check that the weights file was saved "
            "from this model's code"
        ) from None
    return block


def _made_fresh(read: Mapping[str, torch.Tensor], mapped: Mapping[str, torch.Tensor]) -> set[str]:
    """The keys of `mapped` whose tensors the conversion made in memory of its own (experts
    stacked), not the file's tensors nor views of them: a split of a fused tensor
    (transformers' `Chunk`, GTE's qkv) is a view over the file's mapping, which must be
    copied like the file's own tensors (fast_build.owned_tensors)."""
    ids = {id(t) for t in read.values()}
    storages = {t.untyped_storage().data_ptr() for t in read.values() if t.device.type == "cpu"}
    return {
        k
        for k, t in mapped.items()
        if id(t) not in ids
        and not (t.device.type == "cpu" and t.untyped_storage().data_ptr() in storages)
    }


def _keys_by_file(
    sources: Mapping[str, set[str]],
    file_of: Mapping[str, int],
    mapping: Mapping[str, str],
    ties: Mapping[str, frozenset[str]],
    count: int,
) -> list[set[str]]:
    """Per file, the module keys made (in part) from its tensors, with the names tied to
    them: what must be read again when that file changes."""
    raw_of = {v: k for k, v in mapping.items()}
    out: list[set[str]] = [set() for _ in range(count)]
    for key, made_from in sources.items():
        for source in made_from:
            out[file_of[raw_of[source]]] |= {key} | ties.get(key, frozenset())
    return out


def _mismatch(
    missing: list[str],
    unexpected: list[str],
    file_keys: list[str],
    module_keys: set[str],
    ties: Mapping[str, frozenset[str]],
    prefix: Mapping[str, str] | None,
    converted: str | None = None,
) -> str:
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing[:8])}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected[:8])}")
    text = "weights do not match the model (" + "; ".join(problems) + ")"
    if converted:
        text += f" after transformers' key conversion ({converted})"
    fix = suggest_prefix(file_keys, module_keys, ties)
    if fix is not None:
        verb = "use" if prefix else "add"
        return (
            f"{text}; the keys differ by a prefix only: {verb} `{prefix_line(fix)}` in the "
            "model's config"
        )
    return text + "; check that the weights file was saved from this model's code"


def _check_tied_values(
    mapped: Mapping[str, torch.Tensor], ties: Mapping[str, frozenset[str]]
) -> None:
    """A file holding two different tensors for names this model ties would load one of
    them silently: refuse it."""
    seen: set[frozenset[str]] = set()
    for group in ties.values():
        present = sorted(group & mapped.keys())
        if group in seen or len(present) < 2:
            continue
        seen.add(group)
        first = mapped[present[0]]
        for other in present[1:]:
            t = mapped[other]
            if t.shape != first.shape or not torch.equal(t, first):
                raise LoadError(
                    f"the weights file holds different values for {present[0]} and {other}, "
                    "which this model ties (one shared tensor); untie them in the model's code "
                    "or save the weights from a model that ties them"
                )

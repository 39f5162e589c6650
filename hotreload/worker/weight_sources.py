"""Where a new version's weights come from: the serving version, the files, pushes.

The base weights are the serving version's tensors, shared (inference never writes them),
when the files are unchanged since it loaded them and the new module has the same names,
shapes and dtypes: a code edit of a 1 GiB model moves no weight bytes. Otherwise they are
another worker's block, mapped, or the files (worker/weights.py), read straight onto the
device. Then come the pushes made since the files last changed (`overlays`,
worker/pushed_state.py), in order, but those the base holds: the weights that serve are
always "the files, then the pushes", whichever worker builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hotreload.worker import adapter_pushes
from hotreload.worker.adapters import AdapterSet, attach
from hotreload.worker.compiled_names import unwrap
from hotreload.worker.fast_build import retie
from hotreload.worker.load_error import LoadError
from hotreload.worker.pushed_state import read_state
from hotreload.worker.shared_weights import SharedBlock, as_mapped, map_block
from hotreload.worker.weights import (
    _problems,
    apply_prefix,
    load_weights,
    packed_entries,
    tied_groups,
)


@dataclass
class PlacedWeights:
    """What a build's weights came from (kept on its ModelVersion)."""

    #: Names filled from the files, the serving version or a push (not by build()).
    keys: set[str] = field(default_factory=set)
    #: The pushes these weights include, by id.
    overlay_ids: tuple[int, ...] = ()
    #: Tensors shared with the serving version instead of read (0: read or none).
    reused: int = 0
    #: Why the serving version's tensors could not be shared (None: they were, or not asked).
    not_reused: str | None = None
    #: The block of shared memory this build read the files into (CPU), kept until the
    #: version is released; None when it read none (or mapped another worker's).
    shared: SharedBlock | None = None
    #: Tensors mapped from another worker's block (`respawn`, files unchanged): the views,
    #: and the block's digest leaves if its descriptor had them (shared_weights.py).
    mapped: int = 0
    mapped_views: dict[str, torch.Tensor] = field(default_factory=dict)
    mapped_leaves: dict[str, list[str]] | None = None
    #: Per push (by id): its tensors as mapped here, by pushed name; the leaves its
    #: descriptor came with; the leaves this build's digest named (shared_weights.py).
    overlay_views: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    overlay_leaves_in: dict[int, Any] = field(default_factory=dict)
    overlay_leaves: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: Per weights file, the module keys made from it (empty: not known, e.g. mapped).
    by_file: list[set[str]] = field(default_factory=list)
    #: Weights files read for this build (the rest, if any, shared).
    read_files: int = 0
    #: The peft adapters over these weights (worker/adapters.py); None: none declared.
    adapters: AdapterSet | None = None


def _shareable(model: torch.nn.Module, current: Any) -> tuple[dict[str, torch.Tensor], str | None]:
    """The serving version's weight tensors the new module can take as they are (its every
    name, shape and dtype the same), or why not."""
    old_model = unwrap(getattr(current, "model", None))  # compiled: the module inside
    old_keys: set[str] = getattr(getattr(current, "weights", None), "keys", set())
    if not isinstance(old_model, torch.nn.Module) or not old_keys:
        return {}, "the serving version holds no weights to share"
    if getattr(current, "on_host", False):
        return {}, "the serving version is offloaded"
    held = getattr(current.weights, "adapters", None)  # names from before peft renamed them
    old = held.base_state if held is not None else old_model.state_dict(keep_vars=True)
    new = model.state_dict(keep_vars=True)
    if set(new) != set(old):
        return {}, "the module's parameter names changed"
    if packed := packed_entries(new):
        return {}, f"{packed[0]} is a quantized layer's, packed: not shared"
    for key, t in new.items():
        o = old[key]
        if tuple(o.shape) != tuple(t.shape) or o.dtype != t.dtype:
            return {}, f"{key} changed from {o.dtype}{list(o.shape)} to {t.dtype}{list(t.shape)}"
    # New tensor objects over the same memory: the new version's Parameters are its own
    # (a later `.to()` of one version cannot move the other's), the bytes are shared.
    return {k: old[k].detach() for k in old_keys if k in old}, None


def _unchanged_shards(
    model: torch.nn.Module, current: Any, files: Sequence[str], unchanged: Sequence[int]
) -> tuple[dict[str, torch.Tensor], list[int], str | None]:
    """Some weights files changed (a re-saved shard of a sharded checkpoint): the serving
    version's tensors made from the others, the indices of the files to read (the changed
    ones and any that shares a tensor with them: experts of one layer fused across two
    shards), and why nothing could be shared ({}, every index, the reason)."""
    every = list(range(len(files)))
    by_file: list[set[str]] = getattr(current.weights, "by_file", [])
    if len(by_file) != len(files) or current.weights.overlay_ids:
        return {}, every, "the serving version's tensors are not known per file, or pushed"
    shared, why = _shareable(model, current)
    read = [i for i in every if i not in set(unchanged)]
    keys: set[str] = set().union(*(by_file[i] for i in read)) if read else set()
    while more := [i for i in every if i not in read and by_file[i] & keys]:
        read += more
        keys = keys.union(*(by_file[i] for i in more))
    if not shared or len(read) == len(files):
        return {}, every, why or "every file holds part of a changed tensor"
    return {k: t for k, t in shared.items() if k not in keys}, sorted(read), None


def _mappable(
    model: torch.nn.Module, base: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], str | None]:
    """Another worker's weights block, mapped, when it fits the new module exactly."""
    new = model.state_dict(keep_vars=True)
    entries = {e["name"]: e for e in base.get("tensors", [])}
    for key, t in new.items():
        e = entries.get(key)
        if e is not None and (list(t.shape) != e["shape"] or str(t.dtype)[6:] != e["dtype"]):
            return {}, f"{key} changed from {e['dtype']}{e['shape']} to {t.dtype}{list(t.shape)}"
    if set(entries) - set(new):
        return {}, "the module's parameter names changed"
    try:
        return map_block(base), None
    except ValueError as exc:
        return {}, str(exc)


def _pushed_names(
    names: Iterable[str], prefix: Mapping[str, str] | None, own: Mapping[str, Any]
) -> dict[str, str]:
    """The module's name -> each pushed name: `weights_prefix` maps a push's names as it maps a
    file's keys (the factory may wrap the model a trainer pushes). A name the module has as
    it is stays as it is (a trainer that added the prefix itself)."""
    mapping = apply_prefix(names, prefix)
    return {(k if k in own and mapping[k] not in own else mapping[k]): k for k in mapping}


def _overlay_state(
    model: torch.nn.Module,
    overlay: Mapping[str, Any],
    device: torch.device,
    prefix: Mapping[str, str] | None = None,
    views: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """One push, checked against the module from its descriptor before a byte is read (an
    unknown name in a 2 GiB push took 31 s to refuse when read first): every name known
    (after `weights_prefix`), every shape equal, with `strict` every weight present and
    every dtype the module's; without, a dtype is cast to the module's."""
    own = model.state_dict(keep_vars=True)
    raw = {e["name"]: e for e in overlay["state"].get("tensors", [])}
    names = {pushed: mine for mine, pushed in _pushed_names(raw, prefix, own).items()}
    entries = {names[k]: e for k, e in raw.items()}
    _check_pushed(own, entries, tied_groups(model), bool(overlay.get("strict", True)))
    read = read_state(overlay["state"], device)
    out = {}
    for k, t in read.items():
        mine = names[k]
        out[mine] = t if t.dtype == own[mine].dtype else t.to(own[mine].dtype)
        if views is not None and out[mine] is t and t.device.type == "cpu":
            views[k] = t  # by pushed name, as mapped (shared_weights.leaves_over)
    if views:
        as_mapped(views)
    return out


def _check_pushed(
    own: Mapping[str, torch.Tensor],
    entries: Mapping[str, Mapping[str, Any]],
    ties: Any,
    strict: bool,
) -> None:
    missing, unexpected = _problems(set(own), set(entries), ties)
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
        raise LoadError(
            f"pushed weights name {len(unexpected)} tensor(s) the model does not have: "
            f"{shown}; the model's names look like {', '.join(sorted(own)[:3])}"
        )
    if strict and missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise LoadError(
            f"pushed weights miss {len(missing)} of the model's tensor(s): {shown}; push "
            "them all, or pass strict=False to update only some"
        )
    for name, e in entries.items():
        mine = own[name]
        if list(e["shape"]) != list(mine.shape):
            raise LoadError(
                f"pushed {name} has shape {list(e['shape'])}, the model's is {list(mine.shape)}"
            )
        dtype = str(mine.dtype).removeprefix("torch.")
        if strict and e["dtype"] != dtype:
            raise LoadError(
                f"pushed {name} is {e['dtype']}, the model's is {dtype}; cast it before "
                f"pushing, or pass strict=False to have it cast to {dtype}"
            )


def place_weights(
    model: Any,
    files: Sequence[str],
    prefix: Mapping[str, str] | None,
    *,
    root: str,
    device: torch.device,
    current: Any = None,
    base: Mapping[str, Any] | None = None,
    overlays: Sequence[Mapping[str, Any]] = (),
    step_done: Callable[[], None] = lambda: None,
    shared: bool = False,
    unchanged: Sequence[int] | None = None,
    adapters: tuple[Sequence[Mapping[str, Any]], str | None] = ((), None),
    restart: bool = False,
) -> PlacedWeights:
    """Fill `model`'s weights: the base (shared from `current`, or mapped from another
    worker's block `base`, else the files), then the `overlays` the base does not hold yet,
    then the peft `adapters` (declared folders, default) over them. `unchanged` (with
    `current`): the indices of the files unchanged since `current` read them (their tensors
    shared, the others read). `restart`: the worker died and this build brings its version
    back (adapters.py). LoadError says what does not fit."""
    placed = PlacedWeights()
    specs, default_adapter = adapters
    if specs and not isinstance(model, torch.nn.Module):
        raise LoadError(
            f"adapters are declared but the factory returned {type(model).__name__}, not a "
            "torch.nn.Module (peft injects its layers into a module)"
        )
    if not isinstance(model, torch.nn.Module):
        load_weights(model, files, prefix, root=root, assign=True, device=device)
        if overlays:
            raise LoadError(
                f"weights were pushed but the factory returned {type(model).__name__}, not "
                "a torch.nn.Module"
            )
        return placed
    state: dict[str, torch.Tensor] = {}
    base_overlays: tuple[int, ...] = ()
    pushed_adapters: list[Any] = []
    if specs:
        own = set(model.state_dict(keep_vars=True))
        overlays, pushed_adapters = adapter_pushes.split(
            overlays, own, specs, default_adapter, prefix, device
        )
    read = list(range(len(files)))
    if current is not None and unchanged is not None:
        state, read, placed.not_reused = _unchanged_shards(model, current, files, unchanged)
        placed.reused, placed.keys = len(state), set(state)
    elif current is not None:
        state, placed.not_reused = _shareable(model, current)
        if state:
            placed.reused = len(state)
            placed.keys = set(state)
            base_overlays = getattr(current.weights, "overlay_ids", ())
            placed.by_file, read = list(current.weights.by_file), []
    elif base is not None and device.type == "cpu":
        # The files' weights as the other worker read them: its pushes come on top again.
        state, placed.not_reused = _mappable(model, base)
        placed.mapped, placed.keys = len(state), set(state)
        placed.mapped_views, placed.mapped_leaves = dict(state), base.get("leaves")
        as_mapped(placed.mapped_views)
        read = [] if state else read
    if read and files:
        by_file: list[set[str]] = []
        placed.shared = load_weights(
            model,
            [files[i] for i in read],
            prefix,
            root=root,
            assign=True,
            device=device,
            shared=shared,
            elsewhere=set(state),
            by_file=by_file,
        )
        placed.keys = set(model.state_dict(keep_vars=True))
        placed.read_files = len(read)
        known = list(current.weights.by_file) if state else [set() for _ in files]
        for i, keys in zip(read, by_file, strict=True):
            known[i] = keys
        placed.by_file = known
    step_done()
    applied = list(base_overlays)
    for overlay in overlays:
        if int(overlay["id"]) in base_overlays:
            continue
        views = placed.overlay_views[int(overlay["id"])] = {}
        placed.overlay_leaves_in[int(overlay["id"])] = overlay.get("leaves")
        state.update(_overlay_state(model, overlay, device, prefix, views))
        applied.append(int(overlay["id"]))
        step_done()
    if state:
        ties = tied_groups(model)
        model.load_state_dict(state, strict=False, assign=True)
        retie(model, ties, set(state))
        placed.keys |= set(state)
    placed.overlay_ids = tuple(applied)
    if specs:
        placed.adapters = attach(
            model, specs, default_adapter, current=current, pushes=pushed_adapters,
            device=device, prefix=prefix, restart=restart,
        )  # fmt: skip
        placed.overlay_ids = tuple(sorted({*applied, *(i for i, _ in pushed_adapters)}))
    return placed

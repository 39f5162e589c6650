"""A version's weights in one shared memory block, so the next worker maps them instead of
reading the files again.

On the CPU a worker keeps the weights it read in a memfd of its own (one copy, never a
mapping of the file itself, which a save in place would pull from under it). The manager
holds a reference to it; a `respawn` reload's worker, the files unchanged, maps the same
block (`map_block`): no read, no second copy. Nothing writes weights during inference.

The block's digest leaves (weights_digest.py) travel with it: the worker that read the files
names each block tensor's leaves (`leaves_over`), the session adds them to the descriptor,
and a worker that maps the block remembers them (`remember_over`); a push's sealed memfd
likewise. So a build in another worker hashes only its own new tensors. A leaf counts only
for a tensor over exactly that view's bytes (same address, size and dtype): the block is
written once, before anyone maps it, and a pushed memfd is sealed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hotreload.protocol.push_leaves import MAX_LEAVES_JSON, leaf_count, leaves_json_size
from hotreload.worker.weights_digest import REMEMBERED, digest_later, state_digest

ALIGN = 64


@dataclass
class SharedBlock:
    """The memfd a version's weights live in, and where each tensor is."""

    fd: int
    size: int
    entries: list[dict[str, Any]]
    #: Its tensors in this process, by entry name.
    views: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    #: Each entry's digest leaves (hex), once this version's digest hashed them.
    leaves: dict[str, list[str]] | None = None

    def descriptor(self) -> dict[str, Any]:
        out = {"path": f"/proc/{os.getpid()}/fd/{self.fd}", "size": self.size}
        return {**out, "tensors": self.entries, **({"leaves": self.leaves} if self.leaves else {})}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _view(storage: torch.UntypedStorage, entry: Mapping[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    offset = int(entry["offset"]) // dtype.itemsize
    return torch.empty(0, dtype=dtype).set_(storage, offset, tuple(entry["shape"]))


def copy_into_block(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], SharedBlock]:
    """`state`'s CPU tensors copied once into a new memfd; returns the tensors over it."""
    entries, offset = [], 0
    for name, t in state.items():
        entries.append(
            {"name": name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape), "offset": offset}
        )
        offset += -(-t.nbytes // ALIGN) * ALIGN
    size = max(offset, ALIGN)
    fd = os.memfd_create("hotreload-weights", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=True, nbytes=size)
        out = {}
        for entry, (name, t) in zip(entries, state.items(), strict=True):
            view = _view(storage, entry)
            view.copy_(t)
            out[name] = view
    except BaseException:
        os.close(fd)
        raise
    return out, SharedBlock(fd, size, entries, views=out)


def map_block(descriptor: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of another worker's block, mapped (no copy). ValueError when the block
    is gone or not the size described."""
    path, size = str(descriptor["path"]), int(descriptor["size"])
    try:
        actual = os.stat(path).st_size
    except OSError as exc:
        raise ValueError(f"the shared weights {path} are gone ({exc.strerror})") from None
    if actual != size:
        raise ValueError(f"the shared weights {path} hold {actual} bytes, not {size}")
    storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=size)
    return {e["name"]: _view(storage, e) for e in descriptor["tensors"]}


def _at(t: torch.Tensor) -> tuple[int, int, str]:
    return t.data_ptr(), t.nbytes, _dtype_name(t.dtype)


def _over(state: Mapping[str, torch.Tensor]) -> dict[tuple[int, int, str], torch.Tensor]:
    """State tensors by (address, size, dtype): which lie exactly over a mapped view."""
    return {
        _at(t): t
        for t in state.values()
        if t.device.type == "cpu" and t.is_contiguous() and t.nbytes
    }


def leaves_over(
    state: Mapping[str, torch.Tensor], views: Mapping[str, torch.Tensor]
) -> dict[str, list[str]]:
    """The leaves the digest of `state` remembered for its tensors over `views` (a block's
    or a push's mapping, by the name its descriptor gives each), in hex."""
    over, out, size = _over(state), {}, 0
    for name, view in views.items():
        t = over.get(_at(view)) if view.device.type == "cpu" else None
        leaves = REMEMBERED.get(t) if t is not None else None
        if leaves is not None:
            out[name] = [leaf.hex() for leaf in leaves]
            size += leaves_json_size(name, len(leaves))
            if size > MAX_LEAVES_JSON:
                return {}
    return out


def as_mapped(views: Mapping[str, torch.Tensor]) -> None:
    """Note each view's in-place version counter as it was mapped: leaves named elsewhere
    are of those bytes, and a write in this worker since (a load hook's, in place, onto its
    private copy of a page) means they are not (`remember_over`)."""
    for view in views.values():
        view._hotreload_mapped_at = view._version  # type: ignore[attr-defined]


def remember_over(
    state: Mapping[str, torch.Tensor], views: Mapping[str, torch.Tensor], leaves: Any
) -> int:
    """Remember `leaves` (as `leaves_over` gave them, in another worker, or as the client
    hashed a push) for the tensors of `state` over `views`, this worker's mapping of the
    same memory, unwritten since `as_mapped`; returns how many."""
    if not isinstance(leaves, dict) or not views:
        return 0
    over, n = _over(state), 0
    for name, view in views.items():
        if getattr(view, "_hotreload_mapped_at", None) != view._version:
            continue  # written here since it was mapped (or never noted): hashed here
        t = over.get(_at(view)) if view.device.type == "cpu" else None
        hexes = leaves.get(name)
        if t is None or not isinstance(hexes, list) or len(hexes) != leaf_count(t.nbytes):
            continue  # not over this view, or not leaves of its size: hashed here
        try:
            got = [bytes.fromhex(h) for h in hexes]
        except (TypeError, ValueError):
            continue
        if all(len(leaf) == 32 for leaf in got):
            REMEMBERED.put(t, got)
            n += 1
    return n


def digest_version(mv: Any, state: Mapping[str, torch.Tensor], placed: Any, *, now: bool) -> None:
    """`mv.digest` of `state`, now or on a thread (`mv.digest_future`), and `mv.hashed_bytes`.
    The leaves other workers named for what this one maps (a block, pushes) are remembered
    first; once it is hashed, the leaves of what it mapped or read are named in turn
    (before op DIGEST answers: its callback comes after this one)."""
    remember_over(state, placed.mapped_views, placed.mapped_leaves)
    for i, views in placed.overlay_views.items():
        remember_over(state, views, placed.overlay_leaves_in.get(i))
    block: SharedBlock | None = placed.shared
    before = REMEMBERED.hashed_bytes
    # The state, only until it is hashed: the future keeps its callbacks, and a callback
    # holding the state would keep a released version's weights alive (a cycle via `mv`).
    held = [state]

    def hashed(digest: str | None) -> None:
        try:
            if digest is not None:
                with contextlib.suppress(Exception):  # without them the next build hashes all
                    _name_leaves(held[0], placed, block)
            # After the leaves: a LOAD reply that finds the digest done carries them too.
            mv.digest = digest
            mv.hashed_bytes = REMEMBERED.hashed_bytes - before
        finally:
            held.clear()
            placed.mapped_views, placed.overlay_views = {}, {}
            if block is not None:
                block.views = {}

    if now:
        hashed(state_digest(state))
        return
    mv.digest_future = digest_later(state)
    del state
    mv.digest_future.add_done_callback(
        lambda f: hashed(f.result() if f.exception() is None else None)
    )


def _name_leaves(state: Mapping[str, torch.Tensor], placed: Any, block: SharedBlock | None) -> None:
    if block is not None:
        block.leaves = leaves_over(state, block.views)
    placed.overlay_leaves = {
        str(i): leaves for i, v in placed.overlay_views.items() if (leaves := leaves_over(state, v))
    }

"""A version's weights in one shared memory block, so the next worker maps them instead of
reading the files again.

On the CPU a worker keeps the weights it read from the files in a memfd of its own (one
copy, as before: never a mapping of the file itself, which a save in place would pull from
under it). The manager holds a reference to that memfd; when a `respawn` reload builds in
another worker and the weights files are unchanged, that worker maps the same block
(`map_block`): no read of the files, no second private copy, the pages shared. Nothing
writes weights during inference, so sharing them across processes is safe.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64


@dataclass
class SharedBlock:
    """The memfd a version's weights live in, and where each tensor is."""

    fd: int
    size: int
    entries: list[dict[str, Any]]

    def descriptor(self) -> dict[str, Any]:
        return {
            "path": f"/proc/{os.getpid()}/fd/{self.fd}",
            "size": self.size,
            "tensors": self.entries,
        }

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _view(storage: torch.UntypedStorage, entry: Mapping[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, entry["dtype"])
    itemsize = torch.empty((), dtype=dtype).element_size()
    offset = int(entry["offset"]) // itemsize
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
    return out, SharedBlock(fd, size, entries)


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

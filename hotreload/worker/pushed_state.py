"""A state a client pushed (`protocol/shared_state.py`) into tensors this worker owns.

CUDA tensors come in a few chunks, one IPC handle each (protocol/cuda_chunks.py), each
opened once and each tensor copied out of it once, into the worker's own memory on its
device: the trainer frees its chunks as soon as the reply is back.

memfd tensors for a CPU worker are not copied at all: the memfd is sealed against writes
and resizing (checked before use), so its pages cannot change or go away, and the tensors
are views of a private (copy-on-write) mapping of it: no read into fresh memory, whose page
faults bounded a push (a 1 GiB push spent 1.3 s there). For a GPU worker they are read with
`preadv` into one host tensor at a time, then copied over.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from hotreload.protocol import cuda_chunks
from hotreload.protocol.shared_state import REQUIRED_SEALS, validate_descriptor

#: One read(2) moves at most this much (Linux caps a call at 2 GiB - 4 KiB).
_MAX_IO = 1 << 30


def read_state(
    descriptor: Mapping[str, Any], device: str | torch.device
) -> dict[str, torch.Tensor]:
    """The pushed tensors, in descriptor order, each a tensor of this process's own on
    `device`. ValueError, saying what is wrong, for a bad descriptor or memory that is gone
    (the client closed it first) or is not the one described. Read a descriptor once: each
    CUDA IPC handle counts one reader; one that fails validation is left untouched."""
    validate_descriptor(descriptor)
    target = torch.device(device)
    out: dict[str, torch.Tensor] = {}
    chunks = _Chunks(descriptor)
    try:
        with _opened_memfd(descriptor) as fd:
            mapped = _map(fd, descriptor) if fd is not None and target.type == "cpu" else None
            for entry in descriptor["tensors"]:
                if entry["via"] == "memfd" and mapped is not None:
                    out[entry["name"]] = _mapped_tensor(mapped, entry)
                elif entry["via"] == "memfd":
                    assert fd is not None  # validate_descriptor: a memfd tensor has a path
                    out[entry["name"]] = _read_memfd_tensor(fd, entry, target)
                else:
                    out[entry["name"]] = chunks.copy(entry, target)
    finally:
        chunks.close()
    if target.type == "cuda":
        # The copies ran on this thread's stream; the version may serve on another.
        torch.cuda.current_stream(target).synchronize()
    return out


@contextlib.contextmanager
def _opened_memfd(descriptor: Mapping[str, Any]) -> Iterator[int | None]:
    path = descriptor["path"]
    if path is None:
        yield None
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(
            f"the pushed state's memory is gone: {path} no longer exists (the client closed "
            "it, or exited, before the worker read it)"
        ) from None
    except PermissionError:
        raise ValueError(
            f"the worker may not open the pushed state at {path}: a process may open another "
            "one's memfd only when both run as the same user and the sender is dumpable"
        ) from None
    try:
        _check_memfd(fd, descriptor)
        yield fd
    finally:
        os.close(fd)


def _check_memfd(fd: int, descriptor: Mapping[str, Any]) -> None:
    """That what `path` opened is this request's memfd, sealed, of the described size.
    Checked on the open fd, not the path: the client's fd number may since name another
    file (it timed out and closed the memfd, then opened something else)."""
    path, name, size = descriptor["path"], descriptor["memfd_name"], descriptor["size"]
    link = os.readlink(f"/proc/self/fd/{fd}")
    if link != f"/memfd:{name} (deleted)":
        raise ValueError(
            f"{path} is not the pushed state's memory any more (it is {link}, not memfd "
            f"{name}): the client closed it before the worker read it"
        )
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise ValueError(
            f"the pushed state's memfd {name} is not sealed against writes and resizing; "
            "pack it with hotreload.protocol.shared_state.pack_state"
        )
    actual = os.fstat(fd).st_size
    if actual != size:
        raise ValueError(
            f"the pushed state's memfd {name} holds {actual} bytes, not the {size} its "
            "descriptor declares"
        )


def _map(fd: int, descriptor: Mapping[str, Any]) -> mmap.mmap | None:
    """The whole memfd, mapped private and writable (copy-on-write: a write never reaches
    the memfd, whose seal forbids shared writable mappings); None for an empty one."""
    size = int(descriptor["size"])
    if size == 0:
        return None
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _mapped_tensor(mapped: mmap.mmap, entry: Mapping[str, Any]) -> torch.Tensor:
    """The tensor `entry` describes, as a view of the mapping (it keeps the mapping alive).
    Its offset is 64-byte aligned (validate_descriptor), as torch's own allocations are, so
    kernels take the same code path, with the same rounding, as on a copy."""
    dtype = getattr(torch, entry["dtype"])
    nbytes = int(entry["nbytes"])
    if nbytes == 0:
        return torch.empty(entry["shape"], dtype=dtype)
    count = nbytes // dtype.itemsize
    flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=int(entry["offset"]))
    return flat.reshape(entry["shape"])


def _read_memfd_tensor(fd: int, entry: Mapping[str, Any], target: torch.device) -> torch.Tensor:
    # On the CPU it lands in the tensor it becomes; for the GPU through one host tensor at
    # a time (a pinned double buffer would overlap the two copies; not worth it yet).
    host = torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]))
    view = memoryview(host.reshape(-1).view(torch.uint8).numpy())
    got, nbytes = 0, entry["nbytes"]
    while got < nbytes:
        n = os.preadv(fd, [view[got : got + _MAX_IO]], entry["offset"] + got)
        if n == 0:
            raise ValueError(
                f"the pushed state ended inside tensor {entry['name']!r} "
                f"({got} of {nbytes} bytes read)"
            )
        got += n
    return host if target.type == "cpu" else host.to(target)


def _local_cuda_index(chunk: Mapping[str, Any], name: str) -> int:
    """This process's index of the trainer's GPU: by UUID when the trainer sent it (the
    two may see the GPUs under other CUDA_VISIBLE_DEVICES), else the trainer's index."""
    if not torch.cuda.is_available():
        raise ValueError(
            f"tensor {name!r} was pushed as a CUDA IPC handle, but this worker has no CUDA "
            "device; push CPU tensors, or run the model on the trainer's GPU"
        )
    uuid = chunk.get("device_uuid")
    if uuid is None:
        return int(chunk["device"])
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise ValueError(
        f"tensor {name!r} lives on GPU {uuid}, which this worker cannot see "
        "(CUDA_VISIBLE_DEVICES); push CPU tensors, or give the worker that GPU"
    )


def _handle_args(chunk: Mapping[str, Any], index: int) -> tuple[Any, ...]:
    """The arguments of `UntypedStorage._new_shared_cuda`, as `_share_cuda_` gave them."""
    h = chunk["handle"]

    def raw(key: str) -> bytes:
        return base64.b64decode(h[key])

    return (
        index,
        raw("handle"),
        int(h["storage_size_bytes"]),
        int(h["storage_offset_bytes"]),
        raw("ref_counter_handle"),
        int(h["ref_counter_offset"]),
        raw("event_handle"),
        bool(h["event_sync_required"]),
    )


class _Chunks:
    """A descriptor's CUDA chunks: each opened when its first tensor is read, dropped after
    its last, and the reader count of any never opened given back at `close`."""

    def __init__(self, descriptor: Mapping[str, Any]) -> None:
        self._records: list[Mapping[str, Any]] = descriptor.get("chunks") or []
        self._open: dict[int, torch.Tensor] = {}
        self._done: set[int] = set()
        #: The last entry of each chunk: after it, the chunk's mapping is dropped.
        self._last = {
            e["chunk"]: e["name"]
            for e in descriptor["tensors"]
            if e["via"] == "cuda_ipc" and e["chunk"] is not None
        }

    def copy(self, entry: Mapping[str, Any], target: torch.device) -> torch.Tensor:
        dtype = getattr(torch, entry["dtype"])
        shape, i = entry["shape"], entry["chunk"]
        if i is None:
            return torch.empty(shape, dtype=dtype, device=target)
        flat = self._open.get(i)
        if flat is None:
            flat = self._open[i] = self._opened(i, entry["name"])
        start, nbytes = int(entry["offset"]), int(entry["nbytes"])
        theirs = flat[start : start + nbytes].view(dtype).view(shape)
        mine = torch.empty(shape, dtype=dtype, device=target)
        # On the current stream of the trainer's device (the one that waited for its
        # event) when the target is that device; copy_ orders a cross-device copy itself.
        mine.copy_(theirs)
        if self._last.get(i) == entry["name"]:
            # The copies out finish before the trainer may get its memory back (the drop
            # syncs the stream too, but only after it let go of the mapping).
            torch.cuda.current_stream(flat.device).synchronize()
            del theirs, flat
            self._open.pop(i)
            self._done.add(i)
        return mine

    def _opened(self, i: int, name: str) -> torch.Tensor:
        """Chunk `i` as a byte tensor over the trainer's memory."""
        chunk = self._records[i]
        index = _local_cuda_index(chunk, name)
        torch.cuda._lazy_init()
        # Opening waits (on this stream) for the copies the trainer made into the chunk.
        # Only an opened chunk counts as read: `close` gives back the count of one that
        # failed to open.
        storage = torch.UntypedStorage._new_shared_cuda(*_handle_args(chunk, index))
        self._done.add(i)
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)

    def close(self) -> None:
        self._open.clear()
        unopened = [c for i, c in enumerate(self._records) if i not in self._done]
        if unopened:
            # Tried without CUDA here too: the counters are shared memory, not the GPU's.
            cuda_chunks.release(torch, unopened)

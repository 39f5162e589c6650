"""A state dict handed to the worker through memory, not through the socket.

`pack_state` writes the CPU tensors of a state (numpy arrays or torch tensors, duck-typed:
no torch import) into one sealed memfd, and copies its CUDA tensors into a few chunks on
their device, each shared by one CUDA IPC handle (`cuda_chunks.py`); the header of the
`update_weights` request carries the `descriptor`, a plain JSON object, and no payload.
The worker opens `/proc/<pid>/fd/<fd>` (its own reference to the same memory, alive after
the client closes its fd) and maps it, or copies each tensor once.

Descriptor (JSON; `validate_descriptor` checks every field):

    {"kind": "memfd" | "cuda_ipc" | "mixed",   # which `via`s occur ("memfd" when empty)
     "path": "/proc/<pid>/fd/<fd>" | null,     # null when no tensor goes via the memfd
     "memfd_name": "hotreload-state-<16 hex>" | null,
     "size": <bytes of the memfd, 0 when none>,
     "chunks": [{"device", "device_uuid", "size", "handle": {...}}],   # [] when no CUDA
     "tensors": [
       {"name", "dtype", "shape", "nbytes", "via": "memfd", "offset"},
       {"name", "dtype", "shape", "nbytes", "via": "cuda_ipc", "chunk", "offset"}],
     "leaves": {name: ["<64 hex>", ...]}}     # optional: memfd tensors' digest leaves

`leaves` are the digest leaves of the memfd tensors, hashed from the memfd as the pack
writes it (push_leaves.py): the worker serving those bytes as they are hashes none of them.

`dtype` is a wire name (`tensors.WIRE_DTYPES`: bool, uint8, int8..int64, float16/32/64,
bfloat16); bytes are little-endian, C-contiguous, each memfd tensor at a 64-byte aligned
`offset` (oneDNN takes another code path, with other rounding, for unaligned data), each
CUDA one at a 512-byte aligned `offset` in its chunk.

Why the random `memfd_name`: a path `/proc/<pid>/fd/<n>` names whatever the client has open
as fd n *now*. After a client timed out and closed the memfd, n may be another file, even
another pushed state; the worker checks that what it opened is the memfd of this request.
Why the seals (shrink, grow, write): nothing can change or truncate the bytes while the
worker reads them, so it reads a consistent state and can never fault on a shrunk mapping.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hotreload.protocol import cuda_chunks, push_leaves
from hotreload.protocol.cuda_chunks import check_span, is_int, nonneg
from hotreload.protocol.tensors import BF16, MAX_RANK, WIRE_DTYPES

#: Every memfd tensor starts on this boundary (framing.PAYLOAD_ALIGN's reason, too).
ALIGN = 64
MEMFD_PREFIX = "hotreload-state-"
#: What a reader requires: no byte may change, and the file may neither shrink nor grow.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
#: Wire dtypes a state may hold (all fixed-size ones; strings are no weights).
STATE_DTYPES = tuple(WIRE_DTYPES)
VIAS = ("memfd", "cuda_ipc")
_PATH_RE = re.compile(r"/proc/([0-9]+)/fd/([0-9]+)")
_NAME_RE = re.compile(re.escape(MEMFD_PREFIX) + r"[0-9a-f]{16}")
#: One write(2) moves at most this much (Linux caps a call at 2 GiB - 4 KiB).
_MAX_IO = 1 << 30


@dataclass
class PackedState:
    """A packed state: its `descriptor` (for the request header) and the memfd behind it.
    Close it once the reply came back: the worker holds its own reference by then."""

    descriptor: dict[str, Any]
    fd: int | None = None
    #: The CUDA chunks shared by IPC handles, alive until close (the worker maps them).
    _keep: list[Any] = field(default_factory=list, repr=False)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        self._keep = []
        if fd is not None:
            os.close(fd)

    def abandon(self) -> None:
        """Close a state whose descriptor was never sent. Each CUDA IPC handle counts one
        reader to come; none will, so the counts are given back here, or torch would keep
        those chunks on the trainer's GPU (in its "limbo") after they are freed."""
        keep, self._keep = self._keep, []
        if keep:
            cuda_chunks.release(_torch_of(keep[0]), self.descriptor.get("chunks") or [])
        self.close()

    def __enter__(self) -> PackedState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


# ----------------------------------------------------------------------------- packing


def _torch_of(value: Any) -> Any:
    """The torch module of a tensor, found without importing it (the tensor's own module,
    else the torch already imported: a subclass may live in another package)."""
    top = sys.modules.get(type(value).__module__.split(".")[0])
    return top if hasattr(top, "UntypedStorage") else sys.modules["torch"]


def _device_type(value: Any) -> str:
    return str(getattr(getattr(value, "device", None), "type", "cpu"))


def _is_torch(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and hasattr(value, "detach")


def _wire_dtype(name: str, value: Any) -> str:
    """The wire dtype name of a tensor or array; ValueError for one that cannot travel."""
    if _is_torch(value):
        dtype = str(value.dtype).removeprefix("torch.")
        if _device_type(value) == "meta":
            raise ValueError(f"tensor {name!r} is on the meta device: it has no data to push")
    else:
        dtype = np.asarray(value).dtype.name  # ml_dtypes' bfloat16 is named "bfloat16" too
    if dtype not in WIRE_DTYPES:
        raise ValueError(
            f"tensor {name!r} has dtype {dtype}, which cannot be pushed; "
            f"use one of {', '.join(STATE_DTYPES)}"
        )
    return dtype


def _host_array(name: str, value: Any) -> np.ndarray:
    """The bytes of a host tensor or array as a C-contiguous little-endian array: a view of
    the caller's memory when it is one already (the write reads it directly), else a copy."""
    dtype = _wire_dtype(name, value)
    if _is_torch(value):
        t = value.detach()
        if _device_type(t) != "cpu":
            t = t.cpu()  # another accelerator (mps, xpu), or CUDA with cuda_ipc=False
        if dtype == BF16:
            # numpy has no bfloat16: its bit pattern, reinterpreted as int16 (no rounding).
            t = t.view(_torch_of(value).int16)
        arr = t.numpy()
    else:
        arr = np.asarray(value)
    if dtype == BF16:
        return np.ascontiguousarray(arr if arr.dtype.kind in "iu" else arr.view(np.uint16))
    return np.ascontiguousarray(arr, dtype=WIRE_DTYPES[dtype])


def _shape(value: Any) -> list[int]:
    return [int(d) for d in (value.shape if hasattr(value, "shape") else np.shape(value))]


def _device_uuid(tensor: Any, index: int) -> str | None:
    """The GPU's UUID, so a worker with other CUDA_VISIBLE_DEVICES finds the same device."""
    try:
        return str(_torch_of(tensor).cuda.get_device_properties(index).uuid)
    except Exception:
        return None


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done : done + _MAX_IO], offset + done)


def pack_state(state: Mapping[str, Any], *, cuda_ipc: bool = True) -> PackedState:
    """Pack `state` (name -> torch tensor or numpy array) for an `update_weights` request.

    Host tensors are written once, straight from their memory (a copy first only for a
    non-contiguous one), into one memfd that is then sealed; CUDA tensors are copied into
    chunks on their device, one IPC handle each (`cuda_ipc=False`: copied to the host
    into the memfd instead, for a worker that cannot map the trainer's device). Either
    way the push holds the bytes the tensors had when this returns."""
    # Every name and dtype is checked before anything is shared: an IPC handle taken for
    # a request that is never sent holds the trainer's memory until it is given back.
    for name, value in state.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"state keys must be non-empty strings, got {name!r}")
        _wire_dtype(name, value)
    entries: list[dict[str, Any]] = []
    descriptor = {"kind": "memfd", "path": None, "memfd_name": None, "size": 0}
    packed = PackedState(descriptor | {"chunks": [], "tensors": entries})
    try:
        host, gpu = _describe(state, cuda_ipc, packed)
        if gpu:
            _share_chunks(packed, gpu)
        if host:
            _write_memfd(packed, host)
    except BaseException:
        packed.abandon()
        raise
    packed.descriptor["kind"] = _kind({e["via"] for e in entries})
    return packed


def _kind(vias: set[str]) -> str:
    """The descriptor's `kind` for the `via`s its tensors use."""
    return "mixed" if len(vias) == 2 else next(iter(vias), "memfd")


_Items = list[tuple[dict[str, Any], Any]]


def _describe(
    state: Mapping[str, Any], cuda_ipc: bool, packed: PackedState
) -> tuple[_Items, _Items]:
    """Fill in the descriptor's entries; returns the entries to write into the memfd and
    those to copy into CUDA chunks, each with its value."""
    entries = packed.descriptor["tensors"]
    host: _Items = []
    gpu: _Items = []
    cursor = 0
    for name, value in state.items():
        # The array (and any copy) is made at write time, so one copy lives at a time.
        dtype, shape = _wire_dtype(name, value), _shape(value)
        nbytes = math.prod(shape) * WIRE_DTYPES[dtype].itemsize
        entry = {"name": name, "dtype": dtype, "shape": shape, "nbytes": nbytes}
        entries.append(entry)
        if _device_type(value) == "cuda" and cuda_ipc:
            entry["via"] = "cuda_ipc"  # its chunk and offset: cuda_chunks.place
            gpu.append((entry, value))
            continue
        offset = -(-cursor // ALIGN) * ALIGN
        entry |= {"via": "memfd", "offset": offset}
        host.append((entry, value))
        cursor = offset + nbytes
    packed.descriptor["size"] = cursor
    return host, gpu


def _share_chunks(packed: PackedState, gpu: _Items) -> None:
    torch = _torch_of(gpu[0][1])
    chunks = cuda_chunks.place(gpu)
    devices = {members[0][1].device for members in chunks}
    for device in devices:
        torch.cuda.synchronize(device)  # the trainer's writes, on any of its streams
    bufs = [cuda_chunks.fill(torch, members) for members in chunks]
    for device in devices:
        torch.cuda.current_stream(device).synchronize()  # the copies, before any new write
    for buf in bufs:
        packed._keep.append(buf)
        packed.descriptor["chunks"].append(cuda_chunks.describe(_device_uuid, buf))


def _write_memfd(packed: PackedState, host: list[tuple[dict[str, Any], Any]]) -> None:
    memfd_name = MEMFD_PREFIX + secrets.token_hex(8)
    fd = os.memfd_create(memfd_name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    packed.fd = fd
    os.ftruncate(fd, packed.descriptor["size"])
    # Leaves only where the header has room for them: else the worker hashes the push.
    hash_it = (
        sum(
            push_leaves.leaves_json_size(e["name"], push_leaves.leaf_count(e["nbytes"]))
            for e, _ in host
        )
        <= push_leaves.MAX_LEAVES_JSON
    )
    with push_leaves.LeafHasher(fd, packed.descriptor["size"] if hash_it else 0) as hasher:
        for entry, value in host:
            arr = _host_array(entry["name"], value)
            data = memoryview(arr.reshape(-1).view(np.uint8))
            offset = entry["offset"]
            hasher.write(
                entry["name"],
                offset,
                arr.nbytes,
                lambda a, b, data=data, at=offset: _write_all(fd, data[a:b], at + a),
            )
            del arr, data  # a non-contiguous tensor's copy lives one tensor long
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
        leaves = hasher.leaves()
        if leaves is not None:
            packed.descriptor["leaves"] = leaves
    packed.descriptor["path"] = f"/proc/{os.getpid()}/fd/{fd}"
    packed.descriptor["memfd_name"] = memfd_name


# ----------------------------------------------------------------------------- checking


def validate_descriptor(d: Any, *, peer_pid: int | None = None) -> None:
    """Raise ValueError, naming the field and what is wrong with it, unless `d` is a
    well-formed descriptor. `peer_pid` (the client's pid, SO_PEERCRED): the memfd must be
    that process's own, so one client cannot make the worker read another's memory."""
    if not isinstance(d, dict):
        raise ValueError(f"the state descriptor must be an object, got {type(d).__name__}")
    tensors = d.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError("state.tensors must be a list of tensor entries")
    size = d.get("size")
    if not nonneg(size):
        raise ValueError(f"state.size must be a byte count (an integer >= 0), got {size!r}")
    chunks = d.get("chunks", [])  # absent: no tensor goes via CUDA
    cuda_chunks.check_chunks(chunks)
    names: set[str] = set()
    vias: set[str] = set()
    for i, t in enumerate(tensors):
        vias.add(_check_entry(i, t, size, names, chunks))
    push_leaves.check_leaves(d.get("leaves"), tensors)
    used = {t["chunk"] for t in tensors if t["via"] == "cuda_ipc"}
    for i in range(len(chunks)):
        if i not in used:
            # The worker would never open it, and its reader count never come back.
            raise ValueError(f"state.chunks[{i}] holds no tensor; send only chunks in use")
    _check_memfd_fields(d, "memfd" in vias, peer_pid)
    kind, want = d.get("kind"), _kind(vias)
    if kind != want:
        raise ValueError(
            f"state.kind is {kind!r} but its tensors go via {sorted(vias) or 'nothing'}; "
            f"it must be {want!r}"
        )


def _check_memfd_fields(d: Mapping[str, Any], used: bool, peer_pid: int | None) -> None:
    path, memfd_name = d.get("path"), d.get("memfd_name")
    if not used:
        if path is not None or memfd_name is not None or d.get("size"):
            raise ValueError(
                "state.path, state.memfd_name and state.size belong to memfd tensors; "
                "with none, they must be null, null and 0"
            )
        return
    m = _PATH_RE.fullmatch(path) if isinstance(path, str) else None
    if m is None:
        raise ValueError(f"state.path must be '/proc/<pid>/fd/<fd>', got {path!r}")
    if peer_pid is not None and int(m.group(1)) != peer_pid:
        raise ValueError(
            f"state.path {path} is a file of process {m.group(1)}, not of the client "
            f"(pid {peer_pid}); a client may push its own memory only"
        )
    if not isinstance(memfd_name, str) or _NAME_RE.fullmatch(memfd_name) is None:
        raise ValueError(
            f"state.memfd_name must be '{MEMFD_PREFIX}' and 16 hex digits, got {memfd_name!r}"
        )


def _check_entry(i: int, t: Any, size: int, names: set[str], chunks: list[dict[str, Any]]) -> str:
    if not isinstance(t, dict):
        raise ValueError(f"state.tensors[{i}] must be an object")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"state.tensors[{i}].name must be a non-empty string, got {name!r}")
    where = f"state tensor {name!r}"
    if name in names:
        raise ValueError(f"{where} appears twice; names must be unique")
    names.add(name)
    dtype, shape, nbytes, via = (t.get(k) for k in ("dtype", "shape", "nbytes", "via"))
    if not isinstance(dtype, str) or dtype not in WIRE_DTYPES:
        raise ValueError(f"{where}: unknown dtype {dtype!r}; use one of {', '.join(STATE_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(map(nonneg, shape)):
        raise ValueError(f"{where}: shape must be a list of sizes >= 0, got {shape!r}")
    expected = math.prod(shape) * WIRE_DTYPES[dtype].itemsize
    if not is_int(nbytes) or nbytes != expected:
        raise ValueError(
            f"{where}: nbytes {nbytes!r} does not match dtype {dtype} and shape {shape} "
            f"({expected} bytes)"
        )
    if via == "memfd":
        check_span(where, t.get("offset"), nbytes, ALIGN, size, "the memfd")
    elif via == "cuda_ipc":
        cuda_chunks.check_entry(where, t, chunks)
    else:
        raise ValueError(f"{where}: via must be one of {', '.join(VIAS)}, got {via!r}")
    return via

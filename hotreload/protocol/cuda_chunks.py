"""The CUDA tensors of a pushed state, copied into a few chunks on their device, each
chunk shared by one CUDA IPC handle.

Why chunks and not one handle per tensor: a model's state is hundreds or thousands of
tensors. Each handle the worker opens is a `cudaIpcOpenMemHandle` plus an IPC event to
open and wait on, and a process holding thousands of opened handles and events was seen
to sync several times slower. A chunk is one of each, whatever the tensor count. The copy
into the chunk (on the device, at its bandwidth) also makes the push a snapshot: from the
moment `pack_state` returns, the trainer may write its tensors and the push keeps the bytes
they had, so a push that is not waited for needs no copy of its own.

Streams: the trainer may write its tensors on streams of its own (torch's are created
non-blocking, unordered with the packing thread's stream, and `AsyncClient` packs on
another thread). So the device is synchronized before the copies (every write queued so
far lands in the chunk) and the copies' stream after them (a write queued once
`pack_state` returns cannot reach them). Then no IPC event is needed: the handle says
`event_sync_required: false`, and the worker opens no event (torch never closes one it
opened, so a worker would collect one per push). The chunks live until the request's
reply (`PackedState` keeps them); the worker copies every tensor out into memory of its
own.

Descriptor part (JSON; `check_chunks` and `check_entry` check every field):

    "chunks": [{"device", "device_uuid", "size", "handle": {...}}],
    "tensors": [{"name", "dtype", "shape", "nbytes", "via": "cuda_ipc",
                 "chunk": <index> | null, "offset": <bytes>}, ...]

A tensor's bytes are C-contiguous at `offset` (a multiple of `CHUNK_ALIGN`) in its chunk;
an empty tensor has no chunk (null) and offset 0. `handle` holds the fields of
`storage._share_cuda_()` after the device, by name, bytes as base64.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

#: Each tensor starts on this boundary in its chunk: the CUDA caching allocator's own
#: block granularity, so kernels see the alignment (and vector loads) a fresh tensor has.
CHUNK_ALIGN = 512
#: A chunk fills up to this size, then the next starts; a bigger tensor has one to itself.
CHUNK_BYTES = 1 << 30
#: Counters in one of torch's IPC reference-counter files (CUDA_IPC_REF_COUNTER_FILE_SIZE):
#: an offset past them would have the worker write outside the mapped file.
REF_COUNTERS_PER_FILE = 10000
#: The `_share_cuda_()` tuple after its device, in order: name -> bytes field?
HANDLE_FIELDS: dict[str, bool] = {
    "handle": True,
    "storage_size_bytes": False,
    "storage_offset_bytes": False,
    "ref_counter_handle": True,
    "ref_counter_offset": False,
    "event_handle": True,
    "event_sync_required": False,
}


def place(
    items: list[tuple[dict[str, Any], Any]], cap: int | None = None
) -> list[list[tuple[dict[str, Any], Any]]]:
    """Give each CUDA tensor's entry its `chunk` and `offset`: tensors of one device fill a
    chunk in state order, and one that would take it past `cap` starts the next. Returns
    each chunk's (entry, tensor) members, in chunk index order."""
    cap = CHUNK_BYTES if cap is None else cap
    chunks: list[list[tuple[dict[str, Any], Any]]] = []
    ends: list[int] = []
    open_chunk: dict[str, int] = {}  # device -> the index of its chunk being filled
    for entry, value in items:
        nbytes = int(entry["nbytes"])
        if nbytes == 0:
            entry |= {"chunk": None, "offset": 0}
            continue
        device = str(value.device)
        i = open_chunk.get(device)
        offset = -(-ends[i] // CHUNK_ALIGN) * CHUNK_ALIGN if i is not None else 0
        if i is None or offset + nbytes > cap:
            i, offset = len(chunks), 0
            chunks.append([])
            ends.append(0)
            open_chunk[device] = i
        entry |= {"chunk": i, "offset": offset}
        chunks[i].append((entry, value))
        ends[i] = offset + nbytes
    return chunks


def fill(torch: Any, members: list[tuple[dict[str, Any], Any]]) -> Any:
    """A new byte tensor on the members' device holding each member's bytes at its offset
    (copied on the current stream; a non-contiguous tensor is gathered by the copy). The
    caller syncs the device before and the stream after (pack_state: once for all chunks)."""
    device = members[0][1].device
    last = members[-1][0]
    size = int(last["offset"]) + int(last["nbytes"])
    try:
        buf = torch.empty(size, dtype=torch.uint8, device=device)
    except Exception as exc:
        if "out of memory" not in str(exc).lower():
            raise
        raise MemoryError(
            f"pushing from {device} copies the pushed tensors into {size / 2**20:.0f} MiB "
            "there first, and the device has no room for it; free memory (or push a part "
            "of the state with strict=False, or push host tensors: state moved .cpu())"
        ) from exc
    with torch.no_grad():
        for entry, value in members:
            start, nbytes = int(entry["offset"]), int(entry["nbytes"])
            t = value.detach()
            buf[start : start + nbytes].view(t.dtype).view(list(t.shape)).copy_(t)
    return buf


def describe(device_uuid: Any, buf: Any) -> dict[str, Any]:
    """The chunk's descriptor record: `buf` (its copies finished: `fill`) shared by one
    IPC handle, with no event for the worker to open and wait on."""
    share = buf.untyped_storage()._share_cuda_()
    device = int(share[0])
    handle = {
        key: (_b64(v) if is_bytes else v)
        for (key, is_bytes), v in zip(HANDLE_FIELDS.items(), share[1:], strict=True)
    }
    handle["event_sync_required"] = False
    return {
        "device": device,
        "device_uuid": device_uuid(buf, device),
        "size": int(buf.numel()),
        "handle": handle,
    }


def release(torch: Any, chunks: list[Mapping[str, Any]]) -> None:
    """Give back the reader count each chunk's handle took (`_share_cuda_` counts one
    reader to come): for chunks no reader will open. Best effort: at worst the memory
    waits, in torch's limbo, for the trainer's exit."""
    for chunk in chunks:
        ref = (chunk.get("handle") or {}).get("ref_counter_handle")
        if ref is None:
            continue
        try:
            torch.UntypedStorage._release_ipc_counter(
                base64.b64decode(ref), chunk["handle"]["ref_counter_offset"], device=chunk["device"]
            )
        except Exception:
            pass


def _b64(value: Any) -> str | None:
    return None if value is None else base64.b64encode(bytes(value)).decode("ascii")


# ----------------------------------------------------------------------------- checking


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def nonneg(value: Any) -> bool:
    return is_int(value) and value >= 0


def _b64_ok(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        base64.b64decode(value, validate=True)
    except ValueError:
        return False
    return True


def check_chunks(chunks: Any) -> None:
    """ValueError, naming the field, unless `chunks` is a list of well-formed chunks."""
    if not isinstance(chunks, list):
        raise ValueError("state.chunks must be a list (empty when no tensor is on a GPU)")
    for i, chunk in enumerate(chunks):
        where = f"state.chunks[{i}]"
        if not isinstance(chunk, dict):
            raise ValueError(f"{where} must be an object")
        device, uuid, size, handle = (
            chunk.get(k) for k in ("device", "device_uuid", "size", "handle")
        )
        if not nonneg(device):
            raise ValueError(f"{where}.device must be a CUDA device index (>= 0), got {device!r}")
        if uuid is not None and not isinstance(uuid, str):
            raise ValueError(f"{where}.device_uuid must be a string or null, got {uuid!r}")
        if not is_int(size) or size <= 0:
            raise ValueError(f"{where}.size must be a byte count > 0, got {size!r}")
        _check_handle(where, handle)
        if handle["storage_size_bytes"] < size:
            raise ValueError(
                f"{where}: the shared storage holds {handle['storage_size_bytes']} bytes, "
                f"fewer than the chunk's {size}"
            )


def _check_handle(where: str, handle: Any) -> None:
    if not isinstance(handle, dict):
        raise ValueError(f"{where}.handle must be an object of _share_cuda_() fields")
    for key, is_bytes in HANDLE_FIELDS.items():
        v = handle.get(key)
        if is_bytes:
            ok, kind = _b64_ok(v), "base64 text"
        elif key == "event_sync_required":
            ok, kind = isinstance(v, bool), "true or false"
        else:
            ok, kind = nonneg(v), "an integer >= 0"
        if not ok:
            raise ValueError(f"{where}.handle.{key} must be {kind}, got {v!r}")
    if handle["ref_counter_offset"] >= REF_COUNTERS_PER_FILE:
        raise ValueError(
            f"{where}.handle.ref_counter_offset must be below {REF_COUNTERS_PER_FILE} (the "
            f"counters in one of torch's files), got {handle['ref_counter_offset']}"
        )


def check_entry(where: str, t: Mapping[str, Any], chunks: list[Mapping[str, Any]]) -> None:
    """A `cuda_ipc` tensor entry lies inside its chunk, aligned (the rest of the entry is
    checked with the memfd ones)."""
    chunk, offset, nbytes = t.get("chunk"), t.get("offset"), int(t["nbytes"])
    if "handle" in t and "chunk" not in t:
        raise ValueError(
            f"{where} comes with an IPC handle of its own: the descriptor is from an older "
            "hotreload client (one handle per tensor); install the same hotreload where "
            "the trainer runs"
        )
    if chunk is None:
        if nbytes or offset != 0:
            raise ValueError(
                f"{where}: only an empty tensor has no chunk (chunk null, offset 0); this "
                f"one has {nbytes} bytes at offset {offset!r}"
            )
        return
    if not nonneg(chunk) or chunk >= len(chunks):
        known = f"0..{len(chunks) - 1}" if chunks else "it is empty"
        raise ValueError(f"{where}: chunk must index state.chunks ({known}), got {chunk!r}")
    check_span(where, offset, nbytes, CHUNK_ALIGN, chunks[chunk]["size"], f"chunk {chunk}")


def check_span(where: str, offset: Any, nbytes: int, align: int, size: int, what: str) -> None:
    """A tensor's bytes start `align`-aligned at `offset` and end inside `what` (`size` bytes)."""
    if not nonneg(offset) or offset % align:
        raise ValueError(f"{where}: offset must be a multiple of {align} (>= 0), got {offset!r}")
    if offset + nbytes > size:
        raise ValueError(
            f"{where}: bytes {offset}..{offset + nbytes} run past the end of {what} ({size} bytes)"
        )

"""Frames: `u32 body length | u32 header length | header JSON | payload bytes`.

The payload is the concatenation of the tensors' raw bytes in header order; the router
forwards it to the worker untouched, so a request is parsed once (its small JSON header)
and its tensor bytes are never copied into Python objects on the manager side.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hotreload.errors import ProtocolError
from hotreload.protocol.json_read import dumps, loads

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")
#: Header JSON above this size is refused even inside a large frame: headers are small.
MAX_HEADER_BYTES = 1024 * 1024


#: The id at the end of a header `pack_frame` wrote for the worker (the id goes in last).
_TAIL_ID = re.compile(rb'"id":(-?[0-9]{1,18})}\s*$')
#: The id at the start of a header the worker wrote (its replies name the id first).
_HEAD_ID = re.compile(rb'^\s*\{\s*"id"\s*:\s*(-?[0-9]{1,18})\s*[,}]')
#: A reply whose header passes MAX_HEADER_BYTES (a tokenized long prompt, echoed logprobs)
#: travels with that header's JSON at the head of its payload; the frame's own header is
#: `{"id": id, SPILLED_HEADER: bytes of that JSON}` (`pack_spilling`, `unspill`). Only the
#: session reads it, from its workers: a client's frame never gets a header this large.
SPILLED_HEADER = "spilled_header"


def header_bytes(header: dict[str, Any]) -> int:
    """The size of `header` as `pack_frame` encodes it (`json_read.dumps`: non-ASCII text
    as UTF-8 through orjson, ASCII-escaped, up to 6 times its UTF-8, by the stdlib)."""
    return len(dumps(header))


@dataclass(frozen=True, slots=True)
class Frame:
    header: dict[str, Any]
    payload: bytes | memoryview


def pack_frame(
    header: dict[str, Any], blobs: Sequence[bytes | memoryview] = ()
) -> list[bytes | memoryview]:
    """The pieces of one frame, ready for `writelines`/`sendmsg` without joining big blobs."""
    return _pieces(dumps(header), blobs)


def _pieces(head: bytes, blobs: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    payload_len = sum(len(b) for b in blobs)
    prefix = _TWO_U32.pack(4 + len(head) + payload_len, len(head))
    if not blobs:
        return [prefix + head]
    return [prefix + head, *blobs]


def unpack_body(body: bytes | bytearray | memoryview) -> Frame:
    """Split a frame body into header and payload; raises ProtocolError on anything odd.
    The error for a whole frame whose header cannot be read carries `request_id` (the
    header's id where it can be found, else None): the reader answers it and reads on."""
    if len(body) < 4:
        raise ProtocolError(f"frame body of {len(body)} bytes is shorter than its 4-byte header")
    (head_len,) = _U32.unpack_from(body, 0)
    if head_len > len(body) - 4:
        raise ProtocolError(
            f"header length {head_len} does not fit in a frame body of {len(body)} bytes"
        )
    if head_len > MAX_HEADER_BYTES:
        raise _unreadable(
            body,
            head_len,
            f"header length {head_len} does not fit in a frame body of {len(body)} bytes "
            f"(at most {MAX_HEADER_BYTES} bytes)",
        )
    try:
        header = loads(memoryview(body)[4 : 4 + head_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _unreadable(body, head_len, f"frame header is not valid JSON: {exc}") from None
    except (RecursionError, ValueError) as exc:
        # What json.loads raises beyond a syntax error: nesting past the recursion limit,
        # an integer of more than 4300 digits. Still a bad frame, not a bug.
        why = f"frame header cannot be read: {type(exc).__name__}: {exc}"
        raise _unreadable(body, head_len, why) from None
    if not isinstance(header, dict):
        raise _unreadable(
            body, head_len, f"frame header must be a JSON object, got {type(header).__name__}"
        )
    return Frame(header, memoryview(body)[4 + head_len :])


def _unreadable(body: bytes | bytearray | memoryview, head_len: int, why: str) -> ProtocolError:
    """The error for a whole frame whose header cannot be read, with the id its header
    names first (a worker's reply) or last (a request `pack_frame` wrote for the worker)."""
    exc = ProtocolError(why)
    head = bytes(body[4 : 4 + min(head_len, 40)])
    tail = bytes(body[max(4, 4 + head_len - 40) : 4 + head_len])
    m = _HEAD_ID.search(head) or _TAIL_ID.search(tail)
    exc.request_id = int(m.group(1)) if m else None  # type: ignore[attr-defined]
    return exc


def pack_spilling(
    header: dict[str, Any], blobs: Sequence[bytes | memoryview] = ()
) -> list[bytes | memoryview]:
    """`pack_frame`, except that a header over MAX_HEADER_BYTES goes at the head of the
    payload (SPILLED_HEADER): a reply is never one its reader must refuse for its header."""
    head = dumps(header)
    if len(head) <= MAX_HEADER_BYTES:
        return _pieces(head, blobs)
    return pack_frame({"id": header.get("id"), SPILLED_HEADER: len(head)}, [head, *blobs])


def unspill(frame: Frame) -> Frame:
    """The frame as it was before `pack_spilling` moved its header into the payload (the
    frame itself when it did not). ProtocolError, with `request_id`, when that header
    cannot be read."""
    size = frame.header.get(SPILLED_HEADER)
    if size is None:
        return frame
    rid = frame.header.get("id")
    payload = memoryview(frame.payload).cast("B")
    try:
        if not isinstance(size, int) or not 0 < size <= len(payload):
            raise ValueError(
                f"{SPILLED_HEADER} {size!r} does not fit a {len(payload)}-byte payload"
            )
        header = loads(payload[:size])
        if not isinstance(header, dict):
            raise ValueError(f"a JSON object was expected, got {type(header).__name__}")
    except (RecursionError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        err = ProtocolError(
            f"a reply's header ({size!r} bytes in its payload) cannot be read: {exc}"
        )
        err.request_id = rid if isinstance(rid, int) else None  # type: ignore[attr-defined]
        raise err from None
    header["id"] = rid
    return Frame(header, payload[size:])


def _check_length(length: int, max_bytes: int) -> None:
    if length > max_bytes:
        raise ProtocolError(
            f"frame of {length} bytes exceeds the maximum frame size of {max_bytes} bytes "
            "(raise max_frame_mib in the config, or send smaller batches)"
        )
    if length < 4:
        raise ProtocolError(f"frame length {length} is too small to hold a header")


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> Frame | None:
    """Read one frame; None on a clean end of stream before a new frame."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("connection closed inside a frame length prefix") from None
        return None
    (length,) = _U32.unpack(prefix)
    _check_length(length, max_bytes)
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"connection closed inside a frame of {length} bytes") from None
    return unpack_body(body)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_frame_sync(sock: socket.socket, max_bytes: int) -> Frame:
    """Blocking twin of `read_frame` for the synchronous client."""
    (length,) = _U32.unpack(_recv_exactly(sock, 4))
    _check_length(length, max_bytes)
    return unpack_body(_recv_exactly(sock, length))


#: Every payload a reader hands out starts on this boundary. oneDNN/MKL kernels take another
#: code path, with other rounding, for data that is not 64-byte aligned: the same input at
#: two addresses gave two answers one float32 step apart (AVX-512 machines).
PAYLOAD_ALIGN = 64


def aligned_buffer(size: int, offset: int = 0) -> memoryview:
    """A writable buffer of `size` bytes whose byte at `offset` sits on a PAYLOAD_ALIGN
    boundary (numpy-owned: the view keeps its memory alive)."""
    import numpy as np

    raw = np.empty(size + PAYLOAD_ALIGN, np.uint8)
    shift = (-(raw.ctypes.data + offset)) % PAYLOAD_ALIGN
    return memoryview(raw[shift : shift + size])


#: Pieces per sendmsg call: the kernel refuses more than IOV_MAX (1024) buffers at once.
_MAX_IOV = 512


def send_frame(sock: socket.socket, pieces: Sequence[bytes | memoryview]) -> None:
    """Write every byte of a frame with `sendmsg`, going on after a partial send (a socket
    with a timeout, or a frame larger than the socket buffer, sends only part of it).
    Big blobs are never joined: the rest of a cut piece is a view."""
    views = [memoryview(p).cast("B") if not isinstance(p, bytes) else p for p in pieces]
    views = [v for v in views if len(v)]
    while views:
        sent = sock.sendmsg(views[:_MAX_IOV])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = memoryview(views[0])[sent:]


class SocketFrameReader:
    """Buffered blocking frame reader: one `recv` brings in every frame that has arrived, so
    a busy worker makes one system call per burst of requests instead of two per frame.

    Each frame's body gets a buffer of its own, laid out so that the payload starts on a
    PAYLOAD_ALIGN boundary whatever the header's length: one input, one answer. The part
    of a large frame not yet buffered is received straight into it (one copy, not two)."""

    def __init__(
        self,
        sock: socket.socket,
        max_bytes: int,
        on_bad_frame: Callable[[ProtocolError], None] | None = None,
        chunk: int = 256 * 1024,
    ) -> None:
        """`on_bad_frame`: called with the error for a frame too large to read, which is
        then skipped (the stream stays in step); without it, read() raises."""
        self.sock = sock
        self.on_bad_frame = on_bad_frame
        self.max_bytes = max_bytes
        self.chunk = chunk
        # One buffer received into again and again (`recv_into`): `recv` allocated a new
        # chunk-sized object per call and the frame's bytes were copied twice more (into a
        # growing buffer, then out of it). Bytes [_pos, _end) are in and not yet read.
        self._buf = bytearray(max(chunk, 8))
        self._view = memoryview(self._buf)
        self._pos = self._end = 0

    def _fill(self, need: int) -> None:
        """At least `need` (at most 8: a frame's two lengths) bytes in the buffer."""
        while self._end - self._pos < need:
            if self._pos:
                # The start of a frame's prefix, at most 7 bytes: moved to the front.
                rest = self._end - self._pos
                self._buf[:rest] = self._buf[self._pos : self._end]
                self._pos, self._end = 0, rest
            k = self.sock.recv_into(self._view[self._end :])
            if k == 0:
                raise ConnectionError("connection closed")
            self._end += k

    def _discard(self, n: int) -> None:
        have = min(self._end - self._pos, n)
        self._pos += have
        n -= have
        if self._pos == self._end:
            self._pos = self._end = 0
        while n > 0:  # everything buffered is read: the buffer takes what is skipped
            k = self.sock.recv_into(self._view, min(n, len(self._view)))
            if k == 0:
                raise ConnectionError("connection closed")
            n -= k

    def read(self) -> Frame:
        """The next frame. A frame too large to read goes to `on_bad_frame` (the reader
        stays in step and reads on), or raises ProtocolError without one."""
        while True:
            try:
                return self._read_one()
            except ProtocolError as exc:
                if self.on_bad_frame is None:
                    raise
                self.on_bad_frame(exc)

    def _read_one(self) -> Frame:
        # A frame is at least 8 bytes: its length, then the header length inside the body.
        self._fill(8)
        length, head_len = _TWO_U32.unpack_from(self._buf, self._pos)
        if length > self.max_bytes:
            # Skip the whole frame, so the stream stays in step and the reader goes on.
            self._discard(4 + length)
        _check_length(length, self.max_bytes)
        start = self._pos + 4
        body = aligned_buffer(length, min(4 + head_len, length))
        have = min(self._end - start, length)
        body[:have] = self._view[start : start + have]
        self._pos = start + have
        if self._pos == self._end:
            self._pos = self._end = 0
        while have < length:
            k = self.sock.recv_into(body[have:], length - have)
            if k == 0:
                raise ConnectionError(f"connection closed after {have} of {length} bytes")
            have += k
        # Writable and aligned: the worker hands the payload to torch.frombuffer as it is.
        return unpack_body(body)

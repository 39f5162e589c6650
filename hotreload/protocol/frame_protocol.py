"""Frames on an asyncio transport without streams: `FrameParser` splits bytes into frames,
`FrameProtocol` hands each frame to a callback in the loop turn its bytes arrived in.

The manager forwards every request twice (client -> worker, worker -> client). With
`StreamReader.readexactly` each frame costs two awaits, a future and a task wake-up per
hop; here a burst of frames is parsed and dispatched in one `data_received` call, so a
reply is written back in the same loop turn the worker's bytes came in.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from hotreload.errors import ProtocolError
from hotreload.protocol.framing import _U32, Frame, _check_length, unpack_body


class FrameParser:
    """Incremental parser: `feed(bytes)` returns the frames completed so far.

    A malformed or oversized frame makes the stream unreadable from there on: `feed`
    returns the frames completed before it and sets `error`; the next call raises it (or
    this one, when no frame came before it). The caller then closes the connection."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._pos = 0
        #: Body length of the frame being collected, once its prefix has been read.
        self._need: int | None = None
        #: Why the stream broke (ProtocolError), once it has.
        self.error: Exception | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet make a whole frame (0 between frames)."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> list[Frame]:
        if self.error is not None:
            raise self.error
        frames: list[Frame] = []
        try:
            self._parse(data, frames)
        except Exception as exc:
            self.error = exc
            if not frames:
                raise
        return frames

    def _parse(self, data: bytes, frames: list[Frame]) -> None:
        buf = self._buf
        if self._pos and self._pos == len(buf):
            buf.clear()  # everything consumed: start over instead of growing
            self._pos = 0
        buf += data
        while True:
            avail = len(buf) - self._pos
            if self._need is None:
                if avail < 4:
                    break
                (length,) = _U32.unpack_from(buf, self._pos)
                _check_length(length, self.max_bytes)
                self._need = length
                self._pos += 4
                avail -= 4
            if avail < self._need:
                break
            end = self._pos + self._need
            view = memoryview(buf)  # one copy of the body, not two (slice, then bytes)
            try:
                body = bytes(view[self._pos : end])
            finally:
                view.release()
            frames.append(_unpack(body))
            self._pos = end
            self._need = None
        if self._pos > 65536 and self._pos * 2 > len(buf):
            del buf[: self._pos]  # drop consumed bytes before the buffer grows much
            self._pos = 0


def _unpack(body: bytes) -> Frame:
    try:
        return unpack_body(body)
    except (RecursionError, ValueError) as exc:
        # What json.loads raises beyond a syntax error: nesting past the recursion limit,
        # an integer of more than 4300 digits. Still a bad frame, not a bug.
        raise ProtocolError(f"frame header cannot be read: {type(exc).__name__}: {exc}") from None


class FrameProtocol(asyncio.Protocol):
    """A connection speaking frames. `on_frame(frame)` runs for each complete frame;
    `on_error(exc)` once for a malformed stream (then nothing more is parsed);
    `on_close(exc)` once when the connection is gone."""

    def __init__(
        self,
        max_bytes: int,
        on_frame: Callable[[Frame], None],
        *,
        on_error: Callable[[Exception], None] | None = None,
        on_close: Callable[[Exception | None], None] | None = None,
        on_open: Callable[[FrameProtocol], None] | None = None,
    ) -> None:
        self.parser = FrameParser(max_bytes)
        self.on_frame = on_frame
        self.on_error = on_error
        self.on_close = on_close
        self.on_open = on_open
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._paused = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.on_open is not None:
            self.on_open(self)

    def data_received(self, data: bytes) -> None:
        if self.parser.error is not None:
            return  # reported once already; nothing after a broken frame can be read
        try:
            frames = self.parser.feed(data)
        except Exception:
            frames = []
        for frame in frames:
            if self.closed:
                return
            self.on_frame(frame)
        if self.parser.error is not None and not self.closed:
            # ProtocolError: report once (after the frames before it), then ignore the rest.
            if self.on_error is not None:
                self.on_error(self.parser.error)
            else:
                self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: a half-closed frame stream has nothing to say

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake_drainers(exc or ConnectionResetError("connection closed"))
        if self.on_close is not None:
            self.on_close(exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers(None)

    # ------------------------------------------------------------------ writing

    def write(self, pieces: list[bytes | memoryview]) -> bool:
        """Queue one packed frame; False when the connection is already closing."""
        t = self.transport
        if t is None or t.is_closing():
            return False
        t.writelines(pieces)
        return True

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self.closed:
            raise ConnectionResetError("connection closed")
        if not self._paused:
            return
        fut = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        await fut

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def is_closing(self) -> bool:
        return self.closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close once the transport has sent what it holds."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is unsent (a peer that stopped reading)."""
        if self.transport is not None:
            self.transport.abort()

    def _wake_drainers(self, exc: Exception | None) -> None:
        while self._drain_waiters:
            fut = self._drain_waiters.popleft()
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

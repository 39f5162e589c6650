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
    this one, when no frame came before it). The caller then closes the connection.

    With `skip_unreadable`, a whole frame whose header cannot be read (too large, not
    JSON) leaves the stream in step: its error (`request_id` naming the header's id where
    it could be found) goes to `unreadable`, and parsing goes on."""

    def __init__(self, max_bytes: int, *, skip_unreadable: bool = False) -> None:
        self.max_bytes = max_bytes
        self.skip_unreadable = skip_unreadable
        #: Errors of the whole frames skipped since the caller last emptied this list.
        self.unreadable: list[ProtocolError] = []
        self._buf = bytearray()
        self._pos = 0
        #: Body length of the frame being collected, once its prefix has been read.
        self._need: int | None = None
        #: Why the stream broke (ProtocolError), once it has.
        self.error: Exception | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet make a whole frame (0 between frames), the
        length prefix of the frame being collected included."""
        return len(self._buf) - self._pos + (4 if self._need is not None else 0)

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
            self._pos = end
            self._need = None
            try:
                frames.append(unpack_body(body))
            except ProtocolError as exc:
                if not self.skip_unreadable:
                    raise
                self.unreadable.append(exc)
        if self._pos > 65536 and self._pos * 2 > len(buf):
            del buf[: self._pos]  # drop consumed bytes before the buffer grows much
            self._pos = 0


class FrameProtocol(asyncio.Protocol):
    """A connection speaking frames. `on_frame(frame)` runs for each complete frame;
    `on_error(exc)` once for a malformed stream (then nothing more is parsed);
    `on_close(exc)` once when the connection is gone. With `on_unreadable`, a whole frame
    whose header cannot be read goes there (a ProtocolError) and the stream reads on.
    With `stall_timeout_s`, a peer that sent part of a frame and then nothing for that
    long goes to `on_stall(bytes held)` (which answers and closes), else is cut off: a
    partial frame is memory held for it."""

    def __init__(
        self,
        max_bytes: int,
        on_frame: Callable[[Frame], None],
        *,
        on_error: Callable[[Exception], None] | None = None,
        on_close: Callable[[Exception | None], None] | None = None,
        on_open: Callable[[FrameProtocol], None] | None = None,
        on_unreadable: Callable[[ProtocolError], None] | None = None,
        stall_timeout_s: float | None = None,
        on_stall: Callable[[int], None] | None = None,
    ) -> None:
        self.parser = FrameParser(max_bytes, skip_unreadable=on_unreadable is not None)
        self.stall_timeout_s = stall_timeout_s
        self.on_stall = on_stall
        #: Loop time of the last bytes received, and the timer that looks at it (one per
        #: connection, armed only while a frame is partly in: the common case costs nothing).
        self._last_data = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self.on_frame = on_frame
        self.on_unreadable = on_unreadable
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
        if self.parser.unreadable and self.on_unreadable is not None:
            skipped, self.parser.unreadable = self.parser.unreadable, []
            for exc in skipped:
                self.on_unreadable(exc)
        if self.parser.error is not None and not self.closed:
            # ProtocolError: report once (after the frames before it), then ignore the rest.
            if self.on_error is not None:
                self.on_error(self.parser.error)
            else:
                self.close()
        elif self.stall_timeout_s is not None and self.parser.pending_bytes:
            loop = asyncio.get_running_loop()
            self._last_data = loop.time()
            if self._stall_timer is None:
                self._stall_timer = loop.call_at(
                    self._last_data + self.stall_timeout_s, self._check_stall
                )

    def _check_stall(self) -> None:
        self._stall_timer = None
        pending = self.parser.pending_bytes
        if self.closed or not pending or self.parser.error is not None:
            return
        assert self.stall_timeout_s is not None
        due = self._last_data + self.stall_timeout_s
        loop = asyncio.get_running_loop()
        if loop.time() < due:  # bytes came since: wait from the last of them
            self._stall_timer = loop.call_at(due, self._check_stall)
        elif self.on_stall is not None:
            self.on_stall(pending)
        else:
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport: a half-closed frame stream has nothing to say

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
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

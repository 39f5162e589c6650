"""The client endpoint: a Unix socket (mode 0600, in a 0700 folder) speaking the frame protocol.

Each connection may pipeline requests; every reply carries the request's id. A malformed
frame gets an error reply and the connection is closed (a length-prefixed stream cannot be
resynchronised), while the worker and every other connection carry on. A whole frame whose
header fields have the wrong types (`protocol/header_fields.py`) gets a `bad_request` reply
naming the field, and the connection stays open. A client that sends part of a frame and
then nothing for `partial_frame_timeout_s` is told so and dropped, with one line on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hotreload.errors import BadRequestError, ClientError, HotreloadError, ProtocolError
from hotreload.paths import ensure_private_dir
from hotreload.protocol.frame_protocol import FrameProtocol
from hotreload.protocol.framing import Frame, pack_frame
from hotreload.protocol.header_fields import header_problem, reply_id

#: Sends a reply: (header, blobs) or an exception to report.
Reply = Callable[[dict[str, Any] | None, list[Any] | BaseException], None]
#: A handler that answers through `reply`, possibly later, without a task of its own
#: (the infer path: no task creation and no extra loop turn per request).
FastHandler = Callable[[dict[str, Any], memoryview | bytes, Reply], None]
#: op name -> handler(header, payload) returning (reply header, reply blobs).
Handler = Callable[
    [dict[str, Any], memoryview | bytes], Awaitable[tuple[dict[str, Any], list[Any]]]
]
#: A handler that also gets the sending process's pid (SO_PEERCRED; None when unknown):
#: a push names memory of the sender's, which the session checks is the sender's own.
PeerHandler = Callable[
    [dict[str, Any], memoryview | bytes, int | None],
    Awaitable[tuple[dict[str, Any], list[Any]]],
]
_UCRED = struct.Struct("3i")
#: Pushes one frame header to a subscriber; False once the subscriber is gone.
Push = Callable[[dict[str, Any]], bool]
#: A subscription (the dashboard's event stream): handler(header, push) starts pushing
#: frames that carry the request's id and returns the function that stops it, called when
#: the connection closes.
StreamHandler = Callable[[dict[str, Any], Push], Callable[[], None]]
#: A subscriber whose unsent output passes this is cut off: it stopped reading.
MAX_STREAM_BACKLOG_BYTES = 8 * 1024 * 1024
#: How long a client may leave a frame half sent before it is dropped (the bytes held for
#: it are memory, and a connection): generous, as a big frame from a busy client is slow.
PARTIAL_FRAME_TIMEOUT_S = 30.0


def error_header(rid: Any, exc: BaseException) -> dict[str, Any]:
    code = (
        exc.code
        if isinstance(exc, ClientError)
        else ("bad_request" if isinstance(exc, ProtocolError) else "error")
    )
    err: dict[str, Any] = {"code": code, "message": str(exc)}
    tb = getattr(exc, "remote_traceback", None)
    if tb:
        err["traceback"] = tb
        # ModelError's str() already appends the traceback for humans; keep the message short.
        err["message"] = str(exc).split("\n--- remote traceback ---", 1)[0]
    return {"id": rid, "ok": False, "error": err}


class Endpoint:
    def __init__(
        self,
        path: Path,
        handlers: dict[str, Handler],
        max_frame_bytes: int,
        fast_handlers: dict[str, FastHandler] | None = None,
        stream_handlers: dict[str, StreamHandler] | None = None,
        peer_handlers: dict[str, PeerHandler] | None = None,
        partial_frame_timeout_s: float = PARTIAL_FRAME_TIMEOUT_S,
    ) -> None:
        self.path = path
        #: Seconds a client may go silent in the middle of a frame before it is dropped.
        self.partial_frame_timeout_s = partial_frame_timeout_s
        self.handlers = handlers
        self.peer_handlers = peer_handlers or {}
        self.fast_handlers = fast_handlers or {}
        self.stream_handlers = stream_handlers or {}
        self.max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[FrameProtocol] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        ensure_private_dir(self.path.parent)
        if self.path.exists():
            if socket_answers(self.path):
                raise AlreadyServingError(self.path)
            self.path.unlink()  # stale socket from a session that crashed
        loop = asyncio.get_running_loop()
        old_umask = os.umask(0o177)  # the socket is created 0600, no window with wider modes
        try:
            self._server = await loop.create_unix_server(self._new_connection, path=str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    @property
    def bound(self) -> bool:
        """This endpoint listens on its socket (start() bound it, close() not yet run)."""
        return self._server is not None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is None:
            # start() never bound the socket (another session serves on it): not ours to remove.
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _new_connection(self) -> FrameProtocol:
        stops: list[Callable[[], None]] = []
        conn: FrameProtocol

        def on_frame(frame: Frame) -> None:
            # Nothing may raise out of here: asyncio would drop the connection with no reply.
            try:
                dispatch(frame)
            except Exception as exc:
                conn.write(pack_frame(error_header(reply_id(frame.header), exc)))

        def dispatch(frame: Frame) -> None:
            problem = header_problem(frame.header)
            if problem is not None:
                # The frame itself was whole: answer it and keep the connection.
                error = BadRequestError(problem)
                conn.write(pack_frame(error_header(reply_id(frame.header), error)))
                return
            op = frame.header["op"]
            fast = self.fast_handlers.get(op)
            if fast is not None:
                self._handle_fast(fast, frame, conn)
                return
            stream = self.stream_handlers.get(op)
            if stream is not None:
                stops.append(self._start_stream(stream, frame, conn))
                return
            task = asyncio.create_task(self._handle(frame, conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        def on_error(exc: Exception) -> None:
            # A length-prefixed stream cannot be resynchronised: say why, then hang up.
            conn.write(pack_frame(error_header(None, BadRequestError(str(exc)))))
            conn.close()

        def on_stall(held: int) -> None:
            wait = self.partial_frame_timeout_s
            why = f"sent {held} bytes of a frame, then nothing for {wait:g} s"
            print(f"hotreload: socket client dropped: it {why}", file=sys.stderr)
            conn.write(pack_frame(error_header(None, BadRequestError(f"the client {why}"))))
            # A client that does not read either holds the answer unsent: cut it off.
            if conn.write_buffer_size():
                conn.abort()
            else:
                conn.close()

        def on_close(exc: Exception | None) -> None:
            for stop in stops:
                with contextlib.suppress(Exception):
                    stop()
            self._connections.discard(conn)

        conn = FrameProtocol(
            self.max_frame_bytes,
            on_frame,
            on_error=on_error,
            on_close=on_close,
            on_open=self._connections.add,
            stall_timeout_s=self.partial_frame_timeout_s,
            on_stall=on_stall,
        )
        return conn

    def _start_stream(
        self, stream: StreamHandler, frame: Frame, conn: FrameProtocol
    ) -> Callable[[], None]:
        rid = frame.header.get("id")

        def push(header: dict[str, Any]) -> bool:
            if conn.is_closing():
                return False
            if conn.write_buffer_size() > MAX_STREAM_BACKLOG_BYTES:
                conn.abort()  # a subscriber that stopped reading must not grow our memory
                return False
            header["id"] = rid
            return conn.write(pack_frame(header))

        try:
            return stream(frame.header, push)
        except Exception as exc:
            conn.write(pack_frame(error_header(rid, exc)))
            return lambda: None

    def _handle_fast(self, fast: FastHandler, frame: Frame, conn: FrameProtocol) -> None:
        rid = frame.header.get("id")

        def reply(header: dict[str, Any] | None, result: list[Any] | BaseException) -> None:
            if isinstance(result, BaseException) or header is None:
                exc = result if isinstance(result, BaseException) else RuntimeError("no reply")
                pieces = pack_frame(error_header(rid, exc))
            else:
                header["id"] = rid
                pieces = pack_frame(header, result)
            # No drain: replies are small next to the socket buffer, and a client that
            # stops reading is cut off by the transport's own limits.
            conn.write(pieces)

        try:
            fast(frame.header, frame.payload, reply)
        except Exception as exc:
            reply(None, exc)

    async def _handle(self, frame: Frame, conn: FrameProtocol) -> None:
        rid = frame.header.get("id")
        op = frame.header["op"]
        handler = self.handlers.get(op)
        peer_handler = self.peer_handlers.get(op)
        try:
            if peer_handler is not None:
                header, blobs = await peer_handler(frame.header, frame.payload, peer_pid(conn))
            elif handler is None:
                known = sorted({*self.handlers, *self.peer_handlers})
                raise BadRequestError(f"unknown op {op!r}; expected one of {', '.join(known)}")
            else:
                header, blobs = await handler(frame.header, frame.payload)
            header["id"] = rid
            pieces = pack_frame(header, blobs)
        except Exception as exc:
            pieces = pack_frame(error_header(rid, exc))
        if conn.write(pieces):
            with contextlib.suppress(ConnectionError):
                await conn.drain()


def peer_pid(conn: FrameProtocol) -> int | None:
    """The pid of the process at the other end of a Unix socket connection (None: unknown)."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None:
        return None
    try:
        pid, _uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except (OSError, struct.error):
        return None
    return pid or None


class AlreadyServingError(HotreloadError):
    """Another session answers on this socket: this one must not start (exit 3)."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"a hotreload session is already serving on {path}; stop it first "
            "(or use `hotreload status` to see it)"
        )


def socket_answers(path: Path) -> bool:
    """Something accepts connections on the Unix socket `path` (a live session)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True

"""Python clients for a running session: `Client` (blocking, thread-safe) and `AsyncClient`.

    from hotreload import Client
    client = Client(config="hotreload.toml")
    out, version = client.infer("mlp", x)       # x: numpy array, torch tensor, tuple or dict

Outputs come back as numpy arrays (a dict or tuple when the model returns one). No torch
import here: a client process stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hotreload.errors import ERROR_CLASSES, ClientError, ModelError, NoServerError, ProtocolError
from hotreload.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    pack_frame,
    read_frame,
    read_frame_sync,
    send_frame,
)
from hotreload.protocol.tensors import decode_tensors, encode_tensors


def _no_server(path: Path, exc: OSError) -> NoServerError:
    if isinstance(exc, PermissionError):
        return NoServerError(
            f"cannot connect to {path}: permission denied (the session belongs to another "
            "user, or its folder's permissions were changed)"
        )
    return NoServerError(
        f"no hotreload session is listening on {path} ({exc.strerror or exc}); "
        "start one with `hotreload watch` or `hotreload serve`"
    )


class InferResult(NamedTuple):
    """What `infer` returns: unpack as `output, version = client.infer(...)`."""

    output: Any
    version: int
    model: str


def resolve_socket(
    config: str | os.PathLike[str] | None, socket_path: str | os.PathLike[str] | None
) -> Path:
    if socket_path is not None:
        return Path(socket_path)
    from hotreload.config import load_config
    from hotreload.paths import socket_path_for

    cfg = load_config(config)
    return socket_path_for(cfg.path, cfg.socket_dir)


def build_infer_header(
    model: str | None, inputs: Any, timeout_s: float | None
) -> tuple[dict[str, Any], list[Any]]:
    if isinstance(inputs, Mapping):
        form, named = "dict", dict(inputs)
    elif isinstance(inputs, (tuple, list)) and inputs and all(hasattr(v, "shape") for v in inputs):
        form, named = "tuple", {f"input_{i}": v for i, v in enumerate(inputs)}
    else:
        form, named = "single", {"input": inputs}
    metas, blobs = encode_tensors(named)
    header: dict[str, Any] = {"op": "infer", "model": model, "form": form, "tensors": metas}
    if timeout_s is not None:
        header["timeout_s"] = timeout_s
    return header, blobs


def raise_for_error(frame: Frame) -> None:
    if frame.header.get("ok"):
        return
    err = frame.header.get("error") or {}
    code = err.get("code", "error")
    message = err.get("message", "request failed")
    if code == "model_error":
        raise ModelError(message, err.get("traceback"))
    raise ERROR_CLASSES.get(code, ClientError)(message)


def decode_result(frame: Frame) -> InferResult:
    h = frame.header
    arrays = decode_tensors(h.get("tensors", []), frame.payload)
    form = h.get("form", "single")
    if form == "single":
        output: Any = next(iter(arrays.values()))
    elif form == "tuple":
        output = tuple(arrays.values())
    else:
        output = arrays
    return InferResult(output, int(h.get("version") or 0), h.get("model", ""))


class Client:
    """Blocking client. Safe to share between threads (one connection per thread)."""

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        timeout_s: float | None = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.socket_path = resolve_socket(config, socket_path)
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._local = threading.local()
        self._ids = itertools.count(1)
        # Every thread's connection, so close() (and garbage collection) closes them all.
        self._all: list[socket.socket] = []
        self._all_lock = threading.Lock()

    def _conn(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # Socket timeout above the request timeout: the server answers timeouts itself.
            sock.settimeout(None if self.timeout_s is None else self.timeout_s + 5.0)
            try:
                sock.connect(str(self.socket_path))
            except OSError as exc:
                sock.close()
                raise _no_server(self.socket_path, exc) from None
            self._local.sock = sock
            with self._all_lock:
                self._all.append(sock)
        return sock

    def _drop_conn(self) -> None:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            with self._all_lock, contextlib.suppress(ValueError):
                self._all.remove(sock)
        self._local.sock = None

    def call(self, header: dict[str, Any], blobs: list[Any] | None = None) -> Frame:
        """Send one request frame and return the reply frame (errors raised as exceptions)."""
        header["id"] = next(self._ids)
        sock = self._conn()
        try:
            send_frame(sock, pack_frame(header, blobs or []))
            frame = read_frame_sync(sock, self.max_frame_bytes)
        except TimeoutError:
            self._drop_conn()
            raise
        except (ConnectionError, OSError, ProtocolError) as exc:
            self._drop_conn()
            raise NoServerError(f"lost the connection to {self.socket_path}: {exc}") from None
        if frame.header.get("id") not in (header["id"], None):
            self._drop_conn()
            raise ProtocolError("reply id does not match the request id")
        if frame.header.get("id") is None and not frame.header.get("ok"):
            self._drop_conn()  # the server closes after a frame it could not parse
        raise_for_error(frame)
        return frame

    def infer(
        self, model: str | None, inputs: Any, *, timeout_s: float | None = None
    ) -> InferResult:
        """Run `inputs` through `model`; returns (output, version, model)."""
        # The server gets the client's own deadline: once this client gives up, the request
        # is dropped rather than computed for nobody.
        wait = timeout_s if timeout_s is not None else self.timeout_s
        header, blobs = build_infer_header(model, inputs, wait)
        return decode_result(self.call(header, blobs))

    def status(self) -> dict[str, Any]:
        return self.call({"op": "status"}).header

    def reload(self, model: str | None = None, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Ask the session to reload `model` (all models when None); waits for the outcome."""
        header: dict[str, Any] = {"op": "reload", "model": model, "trigger": "command"}
        return self.call(header).header

    def ping(self) -> bool:
        return bool(self.call({"op": "ping"}).header.get("ok"))

    def close(self) -> None:
        with self._all_lock:
            socks, self._all = self._all, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        self._local = threading.local()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client: one connection, requests pipelined and matched by id."""

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.socket_path = resolve_socket(config, socket_path)
        self.max_frame_bytes = max_frame_bytes
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        #: Subscriptions: request id -> callback for each frame (None when the stream ends).
        self._streams: dict[int, Callable[[Frame | None], None]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def _ensure(self) -> asyncio.StreamWriter:
        async with self._lock:
            if self._writer is None or self._writer.is_closing():
                try:
                    reader, self._writer = await asyncio.open_unix_connection(
                        str(self.socket_path), limit=self.max_frame_bytes + 1024 * 1024
                    )
                except OSError as exc:
                    raise _no_server(self.socket_path, exc) from None
                self._reader_task = asyncio.create_task(self._read_loop(reader))
            return self._writer

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = NoServerError(f"connection to {self.socket_path} closed")
        try:
            while True:
                frame = await read_frame(reader, self.max_frame_bytes)
                if frame is None:
                    break
                rid = frame.header.get("id")
                stream = self._streams.get(rid)  # type: ignore[arg-type]
                if stream is not None:
                    stream(frame)
                    continue
                fut = self._pending.pop(rid, None)  # type: ignore[arg-type]
                if fut is not None and not fut.done():
                    fut.set_result(frame)
        except Exception as exc:
            error = NoServerError(f"connection to {self.socket_path} failed: {exc}")
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()
            streams, self._streams = self._streams, {}
            for stream in streams.values():
                with contextlib.suppress(Exception):
                    stream(None)
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    async def call(
        self, header: dict[str, Any], blobs: list[Any] | None = None, timeout_s: float | None = None
    ) -> Frame:
        writer = await self._ensure()
        rid = next(self._ids)
        header["id"] = rid
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        writer.writelines(pack_frame(header, blobs or []))
        await writer.drain()
        frame = await (asyncio.wait_for(fut, timeout_s) if timeout_s else fut)
        raise_for_error(frame)
        return frame

    async def subscribe(
        self, header: dict[str, Any], on_frame: Callable[[Frame | None], None]
    ) -> None:
        """Start a subscription (`{"op": "events"}`): `on_frame` gets every frame the session
        pushes for it, on this loop, and None once when the connection ends."""
        writer = await self._ensure()
        rid = next(self._ids)
        header["id"] = rid
        self._streams[rid] = on_frame
        writer.writelines(pack_frame(header))
        await writer.drain()

    async def infer(
        self, model: str | None, inputs: Any, *, timeout_s: float | None = None
    ) -> InferResult:
        header, blobs = build_infer_header(model, inputs, timeout_s)
        wait = None if timeout_s is None else timeout_s + 5.0
        return decode_result(await self.call(header, blobs, wait))

    async def status(self) -> dict[str, Any]:
        return (await self.call({"op": "status"})).header

    async def reload(self, model: str | None = None) -> dict[str, Any]:
        return (await self.call({"op": "reload", "model": model, "trigger": "command"})).header

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

"""Python clients for a running session: `Client` (blocking, thread-safe) and `AsyncClient`.

    from hotreload import Client
    client = Client(config="hotreload.toml")
    out, version, model = client.infer("mlp", x)  # x: numpy array, torch tensor, tuple, dict

Outputs come back as numpy arrays (a dict or tuple when the model returns one). No torch
import here: a client process stays light. A trainer pushes weights from memory with
`update_weights` (a memfd, or CUDA IPC handles for GPU tensors: `protocol/shared_state.py`),
and reads from that version on with `infer(..., min_version=v)`.
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
from hotreload.protocol.shared_state import PackedState, pack_state
from hotreload.protocol.tensors import BF16, bf16_to_float32, decode_tensors, encode_tensors
from hotreload.protocol.text import BYTES
from hotreload.protocol.weights_ops import (
    update_weights_header,
    version_reply,
    wait_version_header,
    weights_reply,
)


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


class _Answer(NamedTuple):
    output: Any
    version: int
    model: str


class InferResult(_Answer):
    """What `infer` returns: unpack as `output, version, model = client.infer(...)`, and
    `.digest`, the content digest of the weights that computed it (the one
    `update_weights` and `hotreload status` report; None for a model without weights)."""

    digest: str | None

    def __new__(
        cls, output: Any, version: int, model: str, digest: str | None = None
    ) -> InferResult:
        self = super().__new__(cls, output, version, model)
        self.digest = digest  # an attribute, not a fourth field: 3-way unpacking holds
        return self

    def _replace(self, **changes: Any) -> InferResult:
        fields = {**self._asdict(), "digest": self.digest, **changes}
        return InferResult(**fields)


def resolve_socket(
    config: str | os.PathLike[str] | None, socket_path: str | os.PathLike[str] | None
) -> Path:
    if socket_path is not None:
        return Path(socket_path)
    from hotreload.config import load_locations
    from hotreload.paths import socket_path_for

    # Only where it lives: a missing entry file must not keep a client from a live session.
    where = load_locations(config)
    return socket_path_for(where.path, where.socket_dir)


def http_headers(config: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The bearer header the HTTP repository routes and tracebacks need (empty: no token)."""
    from hotreload.config import load_locations
    from hotreload.paths import read_http_token

    token = read_http_token(load_locations(config).state_dir)
    return {"Authorization": f"Bearer {token}"} if token else {}


def build_infer_header(
    model: str | None,
    inputs: Any,
    timeout_s: float | None,
    parameters: Mapping[str, Any] | None = None,
    min_version: int | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """A request's header and blobs. A str or a list of str is one strings (BYTES) input;
    a tuple/list of arrays, positional inputs; a dict, named inputs. `min_version`: served
    by that version of the model or a later one (a trainer reading its own push)."""
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
    if parameters:
        header["parameters"] = dict(parameters)
    if min_version is not None:
        header["min_version"] = int(min_version)
    return header, blobs


def _header_or_abandon(
    model: str | None, packed: PackedState, strict: bool, timeout_s: float | None
) -> dict[str, Any]:
    """The request, or the state given back (never sent) when it cannot be made."""
    try:
        return update_weights_header(model, packed, strict, timeout_s)
    except BaseException:
        packed.abandon()
        raise


def raise_for_error(frame: Frame) -> None:
    if frame.header.get("ok"):
        return
    err = frame.header.get("error") or {}
    code = err.get("code", "error")
    message = err.get("message", "request failed")
    if code == "model_error":
        raise ModelError(message, err.get("traceback"))
    raise ERROR_CLASSES.get(code, ClientError)(message)


def _client_value(meta: Mapping[str, Any], arr: Any, raw: bool) -> Any:
    """What a caller gets for one output: strings as str (a list per row), bfloat16 widened
    to float32 (exact) unless `raw` asks for the uint16 bit patterns."""
    if meta["dtype"] == BYTES:
        return arr.tolist()
    if meta["dtype"] == BF16 and not raw:
        return bf16_to_float32(arr)
    return arr


def decode_result(frame: Frame, raw: bool = False) -> InferResult:
    h = frame.header
    metas = h.get("tensors", [])
    decoded = decode_tensors(metas, frame.payload)
    arrays = {m["name"]: _client_value(m, decoded[m["name"]], raw) for m in metas}
    form = h.get("form", "single")
    if form == "single":
        output: Any = next(iter(arrays.values()))
    elif form == "tuple":
        output = tuple(arrays.values())
    else:
        output = arrays
    return InferResult(output, int(h.get("version") or 0), h.get("model", ""), h.get("digest"))


def _rows(inputs: Any) -> Any:
    """One prompt is a batch of one: a str travels as a one-row strings tensor."""
    return [inputs] if isinstance(inputs, str) else inputs


def _unrow(inputs: Any, result: InferResult) -> InferResult:
    """...and its answer comes back as one str when the model answered one string."""
    out = result.output
    if isinstance(inputs, str) and isinstance(out, list) and len(out) == 1:
        return result._replace(output=out[0])
    return result


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

    def call(
        self,
        header: dict[str, Any],
        blobs: list[Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Frame:
        """Send one request frame and return the reply frame (errors raised as exceptions).
        `timeout_s`: this request's own wait, in place of the client's (a long push)."""
        header["id"] = next(self._ids)
        sock = self._conn()
        try:
            if timeout_s is not None:
                sock.settimeout(timeout_s + 5.0)  # above the server's own deadline
            send_frame(sock, pack_frame(header, blobs or []))
            frame = read_frame_sync(sock, self.max_frame_bytes)
        except TimeoutError:
            self._drop_conn()
            raise
        except (ConnectionError, OSError, ProtocolError) as exc:
            self._drop_conn()
            raise NoServerError(f"lost the connection to {self.socket_path}: {exc}") from None
        finally:
            if timeout_s is not None and getattr(self._local, "sock", None) is sock:
                sock.settimeout(None if self.timeout_s is None else self.timeout_s + 5.0)
        if frame.header.get("id") not in (header["id"], None):
            self._drop_conn()
            raise ProtocolError("reply id does not match the request id")
        if frame.header.get("id") is None and not frame.header.get("ok"):
            self._drop_conn()  # the server closes after a frame it could not parse
        raise_for_error(frame)
        return frame

    def infer(
        self,
        model: str | None,
        inputs: Any,
        *,
        timeout_s: float | None = None,
        parameters: Mapping[str, Any] | None = None,
        raw: bool = False,
        min_version: int | None = None,
    ) -> InferResult:
        """Run `inputs` through `model`; returns (output, version, model).

        `parameters` (JSON values) reach the model as keyword arguments, e.g.
        `{"max_new_tokens": 16}`; `raw` returns bfloat16 outputs as their uint16 bits;
        `min_version`: answered by that version or a later one (see `update_weights`)."""
        # The server gets the client's own deadline: once this client gives up, the request
        # is dropped rather than computed for nobody.
        wait = timeout_s if timeout_s is not None else self.timeout_s
        header, blobs = build_infer_header(model, _rows(inputs), wait, parameters, min_version)
        return _unrow(inputs, decode_result(self.call(header, blobs), raw))

    def status(self) -> dict[str, Any]:
        return self.call({"op": "status"}).header

    def reload(self, model: str | None = None, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Ask the session to reload `model` (all models when None); waits for the outcome."""
        header: dict[str, Any] = {"op": "reload", "model": model, "trigger": "command"}
        return self.call(header, timeout_s=timeout_s).header

    def update_weights(
        self,
        model: str | None,
        state: Mapping[str, Any],
        *,
        strict: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Make `state` (name -> torch tensor or numpy array) the weights of a new version
        of `model`; returns `{"version": v, "digest": "sha256:..."}` once it serves.

        The tensors do not cross the socket: CPU ones are written once into shared memory
        the worker copies from, CUDA ones go by IPC handle (same machine, a GPU both see).
        They may be changed or freed once this returns. `strict`: every parameter of the
        model must be in `state`, and nothing else."""
        packed = pack_state(state)
        header = _header_or_abandon(model, packed, strict, timeout_s)
        try:
            return weights_reply(self.call(header, timeout_s=timeout_s))
        finally:
            packed.close()  # the worker holds its own reference to the memory by now

    def wait_version(
        self, model: str | None, version: int, *, timeout_s: float | None = None
    ) -> int:
        """Wait until `model` serves `version` or a later one; returns the version serving."""
        header = wait_version_header(model, version, timeout_s)
        return version_reply(self.call(header, timeout_s=timeout_s))

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
        # No module globals: at interpreter exit they may be gone (contextlib was).
        for sock in self.__dict__.get("_all") or []:
            try:
                sock.close()
            except Exception:
                pass

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
        self,
        model: str | None,
        inputs: Any,
        *,
        timeout_s: float | None = None,
        parameters: Mapping[str, Any] | None = None,
        raw: bool = False,
        min_version: int | None = None,
    ) -> InferResult:
        """As `Client.infer`, awaited."""
        header, blobs = build_infer_header(model, _rows(inputs), timeout_s, parameters, min_version)
        wait = None if timeout_s is None else timeout_s + 5.0
        return _unrow(inputs, decode_result(await self.call(header, blobs, wait), raw))

    async def update_weights(
        self,
        model: str | None,
        state: Mapping[str, Any],
        *,
        strict: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """As `Client.update_weights`, awaited. The packing (a pass over the bytes) runs on
        a thread: the loop keeps serving meanwhile."""
        packed = await asyncio.to_thread(pack_state, state)
        header = _header_or_abandon(model, packed, strict, timeout_s)
        try:
            wait = None if timeout_s is None else timeout_s + 5.0
            return weights_reply(await self.call(header, timeout_s=wait))
        finally:
            packed.close()

    async def wait_version(
        self, model: str | None, version: int, *, timeout_s: float | None = None
    ) -> int:
        """As `Client.wait_version`, awaited."""
        header = wait_version_header(model, version, timeout_s)
        wait = None if timeout_s is None else timeout_s + 5.0
        return version_reply(await self.call(header, timeout_s=wait))

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

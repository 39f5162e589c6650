"""Python clients for a running session: `Client` (blocking, thread-safe) and `AsyncClient`.

    from hotreload import Client
    client = Client(config="hotreload.toml")
    out, version, model = client.infer("mlp", x)  # x: numpy array, torch tensor, tuple, dict

Outputs come back as numpy arrays (a dict or tuple when the model returns one). No torch
import here: a client process stays light. A trainer pushes weights from memory with
`update_weights` (a memfd, or CUDA chunks by IPC handle for GPU tensors:
`protocol/shared_state.py`), and reads from that version on with `infer(..., min_version=v)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from hotreload.client_wire import (
    InferResult,
    _rows,
    _unrow,
    build_infer_header,
    decode_result,
    raise_for_error,
)
from hotreload.errors import NoServerError, ProtocolError, StaleBaseError
from hotreload.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    pack_frame,
    read_frame,
    read_frame_sync,
    send_frame,
)
from hotreload.protocol.weights_ops import version_reply, wait_version_header
from hotreload.push_lane import AsyncLane, PushHandle, ThreadLane, pack_push

#: A call's `timeout_s` that waits as long as the session's job takes (its own deadlines
#: bound it): a rollback or save of a big model outlasts any client-side guess.
UNBOUNDED = math.inf


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
        #: Model -> its pushes (one in flight, one pending, the serving baseline).
        self._lanes: dict[str | None, ThreadLane] = {}

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
        on_sent: Callable[[], None] | None = None,
    ) -> Frame:
        """Send one request frame and return the reply frame (errors raised as exceptions).
        `timeout_s`: this request's own wait, in place of the client's (a long push);
        `on_sent`: called once the request is written, before the reply is waited for."""
        header["id"] = next(self._ids)
        sock = self._conn()
        try:
            if timeout_s == UNBOUNDED:  # a job the session's own deadlines bound
                sock.settimeout(None)
            elif timeout_s is not None:
                sock.settimeout(timeout_s + 5.0)  # above the server's own deadline
            send_frame(sock, pack_frame(header, blobs or []))
            if on_sent is not None:
                on_sent()
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

    def reload(
        self, model: str | None = None, *, timeout_s: float | None = None, force: bool = False
    ) -> dict[str, Any]:
        """Ask the session to reload `model` (all models when None); waits for the outcome.
        Nothing changed since the serving build: a no-op (`unchanged`) unless `force`."""
        header = {"op": "reload", "model": model, "trigger": "command", "force": force}
        return self.call(header, timeout_s=timeout_s).header

    def rollback(
        self,
        model: str | None = None,
        version: int | None = None,
        *,
        timeout_s: float = UNBOUNDED,
    ) -> dict[str, Any]:
        """Serve a kept version of `model` again, as the next version (`version` None: the
        one before the serving one); waits for the outcome (`outcomes`, as `reload`'s).
        A rollback loads a whole model: by default the wait is the session's (the model's
        load, warm and smoke deadlines bound it), not the client's `timeout_s`; a number
        bounds it (TimeoutError: the rollback goes on in the session)."""
        header: dict[str, Any] = {"op": "rollback", "model": model}
        if version is not None:  # a header's `version` is checked as a number where present
            header["version"] = version
        return self._long_call(header, timeout_s, "the rollback").header

    def evals(self, model: str | None = None, since: int = 0) -> dict[str, Any]:
        """The eval results (config `eval`) of `model`'s versions from `since` on, oldest
        first: `{"configured": bool, "evals": [{"version", "figures", "eval_s"} or
        {"version", "error"}, ...]}`. Cheap: the session answers from its history."""
        return self.call({"op": "evals", "model": model, "since": since}).header

    def save(
        self,
        model: str | None,
        folder: str | os.PathLike[str],
        *,
        force: bool = False,
        timeout_s: float = UNBOUNDED,
    ) -> dict[str, Any]:
        """Write the serving weights of `model` (pushed ones included) into `folder` as
        safetensors under the model's own names, or a Hugging Face model's
        `save_pretrained` folder; returns what was written, with the version and digest.
        A folder with files in it is refused unless `force`. By default the wait is the
        session's (the model's `deadlines.load_s` bounds the write), not the client's
        `timeout_s`; a number bounds it (TimeoutError: the save goes on in the session)."""
        header = {
            "op": "save", "model": model, "folder": str(Path(folder).resolve()), "force": force,
        }  # fmt: skip
        return self._long_call(header, timeout_s, "the save").header["saved"]

    def _long_call(self, header: dict[str, Any], timeout_s: float, what: str) -> Frame:
        """A call that runs a model-sized job: TimeoutError says it goes on in the session."""
        try:
            return self.call(header, timeout_s=timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"no answer within {timeout_s:g} s; {what} goes on in the session (its "
                "outcome is in `hotreload status` and the log): wait longer, or pass "
                "timeout_s=math.inf to wait for it"
            ) from None

    @overload
    def update_weights(
        self,
        model: str | None,
        state: Mapping[str, Any],
        *,
        strict: bool = ...,
        timeout_s: float | None = ...,
        wait: Literal[True] = ...,
        full: bool = ...,
    ) -> dict[str, Any]: ...

    @overload
    def update_weights(
        self,
        model: str | None,
        state: Mapping[str, Any],
        *,
        strict: bool = ...,
        timeout_s: float | None = ...,
        wait: Literal[False],
        full: bool = ...,
    ) -> PushHandle: ...

    def update_weights(
        self,
        model: str | None,
        state: Mapping[str, Any],
        *,
        strict: bool = True,
        timeout_s: float | None = None,
        wait: bool = True,
        full: bool = False,
    ) -> dict[str, Any] | PushHandle:
        """Make `state` (name -> torch tensor or numpy array) the weights of a new version
        of `model`; returns `{"version": v, "digest": "sha256:...", ...}` once it serves.

        The tensors do not cross the socket: CPU ones are written once into a sealed memfd,
        CUDA ones are copied on their device into a few chunks that go by IPC handle, one
        each (same machine, a GPU both see; the copy takes their bytes again on that
        device until the worker has read them). Frozen parameters
        unchanged since the push that made the serving weights are not sent (torch's
        in-place version counter tells; pass `model.state_dict(keep_vars=True)`, where
        they show as frozen; `full=True` sends all): a LoRA push costs its adapter.
        Names are the model's, or the names of its weights files: `weights_prefix` applies.
        `strict`: every parameter of the model must be in `state`, and nothing else.

        `wait=False` returns a `PushHandle` once the state is packed and handed over: the
        tensors may change from then on. `handle.result(timeout)` gives the reply when the
        version serves. A push made while an earlier one is still being built waits as the
        one pending push, and a newer one replaces it (docs/training-push.md)."""
        lane = self._lane(model)
        with lane.lock:
            baseline = lane.baseline
        entry = pack_push(model, state, baseline, strict=strict, full=full, timeout_s=timeout_s)
        now = lane.submit(entry)
        handle = entry.handle
        if not wait:
            if not now:
                return handle  # the pending push: handed over, sent when the one before ends
            # Sent before this returns; a request that could not be sent at all (no
            # session) is said here, not only on the handle.
            handle._handed.wait(None if timeout_s is None else timeout_s + 5.0)
            if handle.done() and not handle.sent and handle.superseded_by is None:
                handle.result(0)  # raises why it could not be sent
            return handle
        try:
            return handle.result()
        except StaleBaseError:
            # The caller still waits, so its tensors are as they were: send them all.
            return self.update_weights(model, state, strict=strict, timeout_s=timeout_s, full=True)

    def _lane(self, model: str | None) -> ThreadLane:
        with self._all_lock:
            lane = self._lanes.get(model)
            if lane is None:
                lane = self._lanes[model] = ThreadLane(model, self.call, self._drop_conn)
            return lane

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
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.close()
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
        self._lanes: dict[str | None, AsyncLane] = {}

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
        self,
        header: dict[str, Any],
        blobs: list[Any] | None = None,
        timeout_s: float | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> Frame:
        writer = await self._ensure()
        rid = next(self._ids)
        header["id"] = rid
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        writer.writelines(pack_frame(header, blobs or []))
        if on_sent is not None:
            # Said once the frame is in the transport, not after drain: a cancel during the
            # drain still sends it, and a push thought unsent would give its CUDA chunks
            # back while the worker reads them.
            on_sent()
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
        wait: bool = True,
        full: bool = False,
    ) -> dict[str, Any] | PushHandle:
        """As `Client.update_weights`, awaited. The packing (a pass over the bytes) runs on
        a thread: the loop keeps serving meanwhile. With `wait=False`, `await handle` (or
        `handle.result()` from another thread) gives the reply."""
        lane = self._lanes.get(model)
        if lane is None:
            lane = self._lanes[model] = AsyncLane(model, self.call)
        with lane.lock:
            baseline = lane.baseline
        entry = await asyncio.to_thread(
            pack_push, model, state, baseline, strict=strict, full=full, timeout_s=timeout_s
        )
        lane.submit(entry)
        handle = entry.handle
        if not wait:
            return handle
        try:
            return await handle
        except StaleBaseError:
            return await self.update_weights(
                model, state, strict=strict, timeout_s=timeout_s, full=True
            )

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
        for lane in self._lanes.values():
            lane.close()
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

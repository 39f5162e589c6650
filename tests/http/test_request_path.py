"""The infer request path's shortcuts answer exactly as the long way round did: a body that
is already in is read without a deadline task, infer reads the few fields it needs instead
of a model's whole snapshot, the router does not check the parser's tensors again, one
middleware checks the token and answers errors, flat number lists skip numpy's
item-by-item check, headers are encoded by one compact JSON encoder made once, and an
answer's dtype names come from a table instead of numpy's `dtype.name` property."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import TestServer, make_mocked_request
from prometheus_client import CollectorRegistry

from hotreload.errors import ModelError, ProtocolError
from hotreload.http import body as body_module
from hotreload.http.body import BodyError, BodyLimits, read_body
from hotreload.http.edges import answer_parse_errors_in_json
from hotreload.http.kserve import _items_problem, _numbers_problem, parse_infer_request
from hotreload.http.server import KServeApp
from hotreload.protocol.framing import Frame
from hotreload.protocol.json_read import compact_json
from hotreload.protocol.tensors import BF16, WIRE_DTYPES, encode_tensors

# ------------------------------------------------------------------ the body


def _request(chunks: list[bytes], eof: bool) -> web.Request:
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    for chunk in chunks:
        payload.feed_data(chunk)
    if eof:
        payload.feed_eof()
    return make_mocked_request("POST", "/v2/models/m/infer", payload=payload)


def test_a_body_already_in_is_read_without_a_deadline_task(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_wait_for(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a body that had arrived was read through wait_for (a task)")

    monkeypatch.setattr(body_module, "asyncio", SimpleNamespace(wait_for=no_wait_for))

    async def main() -> bytes:
        return await read_body(_request([b'{"in', b'puts": []}'], eof=True), BodyLimits(5.0, 2**20))

    assert asyncio.run(main()) == b'{"inputs": []}'


def test_a_body_still_arriving_keeps_its_deadline() -> None:
    async def main() -> BodyError:
        with pytest.raises(BodyError) as info:
            await read_body(_request([b'{"in'], eof=False), BodyLimits(0.2, 2**20))
        return info.value

    error = asyncio.run(main())
    assert error.status == 408 and "did not arrive within 0.2 s" in error.message


# ------------------------------------------------------------------ infer over a fake model


class _Router:
    """Answers each request at once with its input doubled, as a worker's reply frame."""

    input_form = "single"

    def __init__(self) -> None:
        self.input_signature = [{"name": "input", "dtype": "float32", "shape": [1, 4]}]
        self.headers: list[dict[str, Any]] = []
        self.tensors_checked: list[bool] = []

    def submit_future(
        self, header: dict[str, Any], payload: Any, *, tensors_checked: bool = False
    ) -> asyncio.Future[Frame]:
        self.headers.append(header)
        self.tensors_checked.append(tensors_checked)
        out = np.frombuffer(bytes(payload), np.float32) * 2
        meta = {"name": "output", "dtype": "float32", "shape": [1, 4], "nbytes": 16}
        reply = Frame({"ok": True, "version": 3, "tensors": [meta], "digest": "d1"}, out.tobytes())
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        return fut


class _Host:
    """A model as infer sees it; its `view` (every figure, built per call) must not be read."""

    name = "mlp"
    version = 3

    def __init__(self, state: str) -> None:
        self.state = state
        self.router = _Router()

    @property
    def view(self) -> Any:
        raise AssertionError("infer built the model's whole snapshot (view) for one request")


def _serve(host: _Host, tmp_path: Path, ask: Callable[[str], Any], token: str | None = None) -> Any:
    session = SimpleNamespace(
        models={host.name: host},
        events=SimpleNamespace(subscribe=lambda callback: lambda: None),
        config=SimpleNamespace(state_dir=tmp_path),
    )
    metrics = SimpleNamespace(registry=CollectorRegistry(), count_bad_request=lambda model: None)
    limits = BodyLimits(5.0, 2**20)
    kapp = KServeApp(session, metrics, 2**20, limits, token)  # type: ignore[arg-type]
    app = kapp.build()

    async def main() -> Any:
        async with TestServer(app) as server:
            return await ask(str(server.make_url("/")))

    return app, asyncio.run(main())


def _infer_body(values: list[float]) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": values}
    return json.dumps({"inputs": [tensor]}).encode()


def test_infer_answers_from_the_router_without_a_snapshot(tmp_path: Path) -> None:
    host = _Host("serving")

    async def ask(url: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "v2/models/mlp/infer", data=_infer_body([1, 2, 3, 4])) as r:
                first = (r.status, await r.json())
            async with http.get(url + "v2/models/mlp/versions/2/ready") as r:
                return *first, await r.json()

    app, (status, doc, wrong_version) = _serve(host, tmp_path, ask)
    assert status == 200, doc
    assert doc == {
        "model_name": "mlp",
        "model_version": "3",
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 4], "data": [2, 4, 6, 8]}],
        "parameters": {"weights_digest": "d1"},
    }
    meta = {"name": "input", "dtype": "float32", "shape": [1, 4], "nbytes": 16}
    assert host.router.headers == [{"tensors": [meta], "form": "single"}]
    # The parser checked the tensors against the body: the router does not again.
    assert host.router.tensors_checked == [True]
    assert wrong_version["error"].startswith("model 'mlp' version 2 is not available; version 3")
    # Infer is the first route aiohttp tries under /v2/models: asked far more than the rest.
    first = next(iter(app.router.resources()))
    assert first.canonical == "/v2/models/{name}/infer"


def test_infer_on_an_unloaded_model_says_how_to_load_it(tmp_path: Path) -> None:
    async def ask(url: str) -> tuple[int, dict[str, Any]]:
        body = _infer_body([1, 2, 3, 4])
        async with (
            aiohttp.ClientSession() as http,
            http.post(url + "v2/models/mlp/infer", data=body) as r,
        ):
            return r.status, await r.json()

    _, (status, doc) = _serve(_Host("unloaded"), tmp_path, ask)
    assert (status, doc) == (
        503,
        {"error": "model 'mlp' is unloaded; POST /v2/repository/models/mlp/load to load it"},
    )


class _FailingRouter(_Router):
    def submit_future(
        self, header: dict[str, Any], payload: Any, *, tensors_checked: bool = False
    ) -> asyncio.Future[Frame]:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        fut.set_exception(ModelError("model 'mlp': boom", "Traceback: model.py line 3"))
        return fut


def test_one_middleware_checks_the_token_and_answers_errors(tmp_path: Path) -> None:
    """The token check and the JSON errors are one middleware (each is a coroutine more on
    every request): a protected path without the token is refused before any handler, an
    unknown one too; a model's traceback goes only to a request that sent the token."""
    host = _Host("serving")
    host.router = _FailingRouter()
    token = {"Authorization": "Bearer s3cret"}

    async def ask(url: str) -> list[tuple[int, dict[str, Any]]]:
        out = []
        async with aiohttp.ClientSession() as http:
            for path, headers in (
                ("v2/repository/index", {}),
                ("v2/repository/nothing", {}),
                ("v2/repository/nothing", token),
                ("v2/models/mlp/infer", {}),
                ("v2/models/mlp/infer", token),
            ):
                body = _infer_body([1, 2, 3, 4])
                async with http.post(url + path, data=body, headers=headers) as r:
                    out.append((r.status, await r.json()))
        return out

    app, answers = _serve(host, tmp_path, ask, token="s3cret")
    assert len(app.middlewares) == 1
    (index, unknown, unknown_with, infer, infer_with) = answers
    assert index[0] == unknown[0] == 401 and "needs the session's token" in index[1]["error"]
    assert unknown_with[0] == 404
    assert infer[0] == infer_with[0] == 500 and infer[1]["error"] == "model 'mlp': boom"
    assert "traceback" not in infer[1] and infer_with[1]["traceback"].startswith("Traceback")


def test_a_malformed_request_after_many_bytes_is_answered_in_its_routes_shape() -> None:
    """The tail a connection keeps to name a malformed request's path is cut back, not
    rebuilt on every read: after 40 KiB of requests on one keep-alive connection, the path
    is still read off the last request line, which follows a body without a newline."""
    app = web.Application()
    app.add_routes([web.post("/v2/x", _ok)])

    async def main() -> bytes:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        answer_parse_errors_in_json(runner, 2**20)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
            body = b"b" * 10_000
            post = b"POST /v2/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            for _ in range(4):
                writer.write(post + body)
                await writer.drain()
                await reader.readuntil(b"ok")
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return reply
        finally:
            await runner.cleanup()

    reply = asyncio.run(main())
    head, _, doc = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", reply
    error = json.loads(doc)["error"]
    assert error["type"] == "invalid_request_error", error  # OpenAI's shape: /v1/...
    assert error["message"].startswith("malformed HTTP request"), error


async def _ok(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text="ok")


# ------------------------------------------------------------------ numbers and JSON

_SAMPLES: list[Any] = [
    [],
    [0.1] * 64,
    [1, 2, 3],
    [1, 2.5, -0.0, 1e300],
    [True, 1],
    [1.0, False],
    [1, "2"],
    [None, 1.0],
    [1, [2]],
    [[1, 2], [3, 4]],
    [[1, 2], [3]],
    [{"a": 1}],
    "1.0",
    7,
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16", "int64", "bool"])
def test_flat_number_lists_are_judged_as_item_by_item(dtype: str) -> None:
    for data in _SAMPLES:
        shape = [2, 2] if data and isinstance(data, list) and isinstance(data[0], list) else [3]
        assert _numbers_problem(data, dtype, shape) == _items_problem(data, dtype, shape), data


def test_json_numbers_become_the_same_bytes_as_before() -> None:
    values = [0.1, 1, -2.5, 3.4e38, 1e-45, 0]
    tensor = {"name": "x", "datatype": "FP32", "shape": [6], "data": values}
    req = parse_infer_request(json.dumps({"inputs": [tensor]}).encode(), None)
    assert bytes(req.inputs[0].data) == np.asarray(values, np.float32).tobytes()


def test_compact_json_is_json_dumps_with_compact_separators() -> None:
    values: list[Any] = [
        {"op": "infer", "tensors": [{"name": "x", "shape": [1, 64], "nbytes": 256}], "id": 7},
        [0.1, 1e300, -0.0, float("nan"), float("inf"), 2**70, True, None],
        "é ☃ \u2028 \x00",
        {"nested": {"a": [], "b": {}}, "k": "v"},
    ]
    for value in values:
        assert compact_json(value) == json.dumps(value, separators=(",", ":"))
    for bad in ({"x": object()}, {1.5j: 1}):
        with pytest.raises(TypeError) as ours:
            compact_json(bad)
        with pytest.raises(TypeError) as theirs:
            json.dumps(bad, separators=(",", ":"))
        assert str(ours.value) == str(theirs.value)


# ------------------------------------------------------------------ answers' tensors


@pytest.mark.parametrize("name", [n for n in WIRE_DTYPES if n != BF16])
@pytest.mark.parametrize("order", ["<", ">", "="])
def test_answer_tensors_are_named_by_their_numpy_dtype(name: str, order: str) -> None:
    arr = (np.arange(6) % 2).astype(np.dtype(name).newbyteorder(order)).reshape(2, 3)
    metas, blobs = encode_tensors({"y": arr})
    assert metas == [{"name": "y", "dtype": arr.dtype.name, "shape": [2, 3], "nbytes": arr.nbytes}]
    assert bytes(blobs[0]) == np.ascontiguousarray(arr, dtype=WIRE_DTYPES[name]).tobytes()


def test_a_dtype_that_cannot_travel_is_named() -> None:
    with pytest.raises(ProtocolError, match="tensor 'z' has dtype complex64, which cannot travel"):
        encode_tensors({"z": np.zeros(2, np.complex64)})

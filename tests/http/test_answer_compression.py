"""Infer answers compressed as before: the coding aiohttp's `enable_compression` picks for
the client's Accept-Encoding, the same body once inflated. Small answers are compressed by
`body.compress_small` (a window sized to the body, a sixth of zlib's default set-up cost),
larger ones by aiohttp as they always were."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from hotreload.http import body as body_module
from hotreload.http.body import (
    SMALL_ANSWER_BYTES,
    STORED_ANSWER_BYTES,
    BodyLimits,
    compress_small,
)
from hotreload.http.server import KServeApp
from hotreload.protocol.framing import Frame

#: Accept-Encoding values a client may send; infer compresses when one names gzip or deflate.
ACCEPTS = [
    "gzip, deflate",
    "gzip",
    "deflate",
    "deflate, gzip",
    "GZIP",
    "gzip;q=0",
    "br, gzip",
    "x-gzip",
    "identity",
    "br",
    "",
]


def _inflate(data: bytes, coding: str | None) -> bytes:
    if coding == "gzip":
        return gzip.decompress(data)
    if coding == "deflate":
        return zlib.decompress(data)  # zlib's wrapper, as aiohttp sends deflate
    assert coding is None, coding
    return data


@pytest.mark.parametrize(
    "size", [0, 1, 100, 511, 512, 513, STORED_ANSWER_BYTES, 1025, 4096, SMALL_ANSWER_BYTES]
)
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_small_bodies_inflate_to_themselves(size: int, coding: str) -> None:
    rng = np.random.default_rng(size)
    text = json.dumps(rng.standard_normal(size // 8 + 1).tolist()).encode()[:size]
    packed, got = compress_small(text, coding)  # type: ignore[misc]
    assert got == coding
    assert _inflate(packed, coding) == text
    # Any inflater reads it: the window a zlib header names is at most the default one.
    assert zlib.decompress(packed, 47) == text
    if size > STORED_ANSWER_BYTES:  # past one packet's worth, compressed for real
        assert len(packed) < 0.7 * size


def test_larger_bodies_are_left_to_aiohttp() -> None:
    assert compress_small(b"x" * (SMALL_ANSWER_BYTES + 1), "gzip") is None


class _Router:
    """Answers each request at once with an output of `size` float32 values."""

    input_form = "single"

    def __init__(self, size: int) -> None:
        self.size = size
        self.input_signature = [{"name": "input", "dtype": "float32", "shape": [1, 4]}]

    def submit_future(
        self, header: dict[str, Any], payload: Any, *, tensors_checked: bool = False
    ) -> asyncio.Future[Frame]:
        out = np.linspace(-1, 1, self.size, dtype=np.float32)
        meta = {"name": "output", "dtype": "float32", "shape": [1, self.size], "nbytes": out.nbytes}
        reply = Frame({"ok": True, "version": 3, "tensors": [meta]}, out.tobytes())
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        return fut


def _app(tmp_path: Path, size: int) -> web.Application:
    host = SimpleNamespace(name="mlp", version=3, state="serving", router=_Router(size))
    session = SimpleNamespace(
        models={"mlp": host},
        events=SimpleNamespace(subscribe=lambda callback: lambda: None),
        config=SimpleNamespace(state_dir=tmp_path),
    )
    metrics = SimpleNamespace(registry=CollectorRegistry(), count_bad_request=lambda model: None)
    kapp = KServeApp(session, metrics, 2**20, BodyLimits(5.0, 2**20))  # type: ignore[arg-type]
    return kapp.build()


def _reference_app(bodies: list[bytes]) -> web.Application:
    """What infer did before: the answer's bytes through aiohttp's enable_compression."""

    async def answer(request: web.Request) -> web.Response:
        resp = web.Response(body=bodies[-1], content_type="application/json")
        accept = request.headers.get("Accept-Encoding", "")
        if "gzip" in accept or "deflate" in accept:
            resp.enable_compression()
        return resp

    app = web.Application()
    app.router.add_post("/", answer)
    return app


async def _ask(url: str, accept: str, body: bytes) -> tuple[int, str | None, bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.post(url, data=body, headers={"Accept-Encoding": accept}) as r,
    ):
        return r.status, r.headers.get("Content-Encoding"), await r.read()


#: auth.py keys the request's storage by a str, which aiohttp warns about (pytest makes
#: warnings errors): a server process only prints it, once.
@pytest.mark.parametrize("size", [10, 4000], ids=["small", "over-the-small-limit"])
def test_infer_answers_are_compressed_as_aiohttp_compressed_them(
    tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[int] = []
    real = body_module.compress_small

    def counted(body: bytes, accept: str) -> Any:
        out = real(body, accept)
        used.append(out is not None)
        return out

    monkeypatch.setattr("hotreload.http.server.compress_small", counted)
    request = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
    plain: list[bytes] = []

    async def main() -> list[tuple[str, tuple[int, str | None, bytes], Any]]:
        async with (
            TestServer(_app(tmp_path, size)) as ours,
            TestServer(_reference_app(plain)) as reference,
        ):
            url = str(ours.make_url("/v2/models/mlp/infer"))
            # The plain answer, then each Accept-Encoding against aiohttp's own compression.
            plain.append((await _ask(url, "identity", json.dumps(request).encode()))[2])
            out = []
            for accept in ACCEPTS:
                got = await _ask(url, accept, json.dumps(request).encode())
                want = await _ask(str(reference.make_url("/")), accept, b"")
                out.append((accept, got, want))
            return out

    for accept, (status, coding, data), (_, want_coding, want_data) in asyncio.run(main()):
        assert status == 200, (accept, data)
        assert coding == want_coding, accept
        assert _inflate(data, coding) == _inflate(want_data, want_coding) == plain[0], accept
    assert json.loads(plain[0])["outputs"][0]["shape"] == [1, size]
    # Small answers took the new path, large ones aiohttp's; each time compression was due.
    compressed = sum("gzip" in a or "deflate" in a for a in ACCEPTS)
    assert used == [size == 10] * compressed

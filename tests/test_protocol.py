"""Frames and tensors on the wire."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import numpy as np
import pytest

from hotreload.errors import ProtocolError
from hotreload.protocol import (
    decode_tensors,
    encode_tensors,
    pack_frame,
    read_frame,
    read_frame_sync,
    unpack_body,
)


def test_frame_round_trip_over_a_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        metas, blobs = encode_tensors(
            {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array([True, False])}
        )
        a.sendmsg(pack_frame({"op": "infer", "tensors": metas}, blobs))
        frame = read_frame_sync(b, 1 << 20)
    arrays = decode_tensors(frame.header["tensors"], frame.payload)
    assert arrays["x"].tolist() == [[0, 1, 2], [3, 4, 5]] and arrays["m"].dtype == np.bool_


@pytest.mark.parametrize(
    "dtype", ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
)
def test_every_wire_dtype_round_trips(dtype: str) -> None:
    x = (np.arange(12) % 7).astype(dtype).reshape(3, 4)
    metas, blobs = encode_tensors({"x": x})
    payload = b"".join(bytes(b) for b in blobs)
    assert np.array_equal(decode_tensors(metas, payload)["x"], x)


def test_unsupported_dtype_is_refused_with_the_list() -> None:
    with pytest.raises(ProtocolError, match=r"complex64.*cannot travel"):
        encode_tensors({"z": np.zeros(2, dtype=np.complex64)})


@pytest.mark.parametrize(
    ("metas", "payload", "message"),
    [
        ("x", b"", "must be a list"),
        (
            [{"name": "x", "dtype": "float128", "shape": [1], "nbytes": 16}],
            b"\0" * 16,
            "unsupported dtype",
        ),
        (
            [{"name": "x", "dtype": "float32", "shape": [-1], "nbytes": 4}],
            b"\0" * 4,
            "shape must be",
        ),
        (
            [{"name": "x", "dtype": "float32", "shape": [2], "nbytes": 4}],
            b"\0" * 4,
            "does not match",
        ),
        (
            [{"name": "x", "dtype": "float32", "shape": [1], "nbytes": 4}],
            b"\0" * 8,
            "payload has 8 bytes",
        ),
        (
            [{"name": "x", "dtype": "int8", "shape": [1], "nbytes": 1}] * 2,
            b"\0\0",
            "appears twice",
        ),
    ],
)
def test_bad_tensor_headers_say_what_is_wrong(metas: object, payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_tensors(metas, payload)  # type: ignore[arg-type]


def test_body_errors() -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        unpack_body(struct.pack(">I", 3) + b"{{{")
    with pytest.raises(ProtocolError, match="JSON object"):
        unpack_body(struct.pack(">I", 2) + b"[]")
    with pytest.raises(ProtocolError, match="does not fit"):
        unpack_body(struct.pack(">I", 99) + b"{}")


def test_async_reader_enforces_max_frame_and_clean_eof() -> None:
    async def run() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 10_000))
        with pytest.raises(ProtocolError, match="exceeds the maximum frame size of 100 bytes"):
            await read_frame(reader, 100)
        reader = asyncio.StreamReader()
        body = json.dumps({"op": "ping"}).encode()
        reader.feed_data(b"".join(pack_frame({"op": "ping"})))
        reader.feed_eof()
        frame = await read_frame(reader, 1000)
        assert frame is not None and frame.header == {"op": "ping"} and len(body) > 0
        assert await read_frame(reader, 1000) is None

    asyncio.run(run())

"""Frames and tensors on the wire."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading

import numpy as np
import pytest

from hotreload.errors import ProtocolError
from hotreload.protocol.framing import (
    SocketFrameReader,
    header_bytes,
    pack_frame,
    read_frame,
    read_frame_sync,
    send_frame,
    unpack_body,
)
from hotreload.protocol.tensors import decode_tensors, encode_tensors


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


def _stream_of(*frames: tuple[dict, list]) -> bytes:
    return b"".join(bytes(p) for h, blobs in frames for p in pack_frame(h, blobs))


def test_frame_parser_reassembles_frames_split_at_every_byte() -> None:
    from hotreload.protocol.frame_protocol import FrameParser

    metas, blobs = encode_tensors({"x": np.arange(5, dtype=np.int64)})
    data = _stream_of(({"id": 1, "tensors": metas}, blobs), ({"id": 2}, []), ({"id": 3}, []))
    for cut in range(1, len(data)):
        parser = FrameParser(1 << 20)
        frames = parser.feed(data[:cut]) + parser.feed(data[cut:])
        assert [f.header["id"] for f in frames] == [1, 2, 3], cut
        assert parser.pending_bytes == 0
        x = decode_tensors(frames[0].header["tensors"], frames[0].payload)["x"]
        assert x.tolist() == [0, 1, 2, 3, 4]
    parser = FrameParser(1 << 20)  # one byte at a time
    got = [f for b in data for f in parser.feed(bytes([b]))]
    assert [f.header["id"] for f in got] == [1, 2, 3]


def test_frame_parser_refuses_oversized_and_malformed_frames() -> None:
    from hotreload.protocol.frame_protocol import FrameParser

    with pytest.raises(ProtocolError, match="exceeds the maximum frame size of 100 bytes"):
        FrameParser(100).feed(struct.pack(">I", 101))
    body = struct.pack(">I", 3) + b"{x}"
    with pytest.raises(ProtocolError, match="not valid JSON"):
        FrameParser(100).feed(struct.pack(">I", len(body)) + body)


def test_frame_protocol_hands_frames_over_and_reports_a_broken_stream() -> None:
    from hotreload.protocol.frame_protocol import FrameProtocol

    async def main() -> None:
        got: list = []
        errors: list = []
        closed = asyncio.Event()
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        _, proto = await loop.create_unix_connection(
            lambda: FrameProtocol(
                1000, got.append, on_error=errors.append, on_close=lambda e: closed.set()
            ),
            sock=a,
        )
        with b:
            b.sendall(_stream_of(({"id": 1}, []), ({"id": 2}, [])))
            b.sendall(struct.pack(">I", 5000))  # over the limit: the stream is broken
            b.sendall(_stream_of(({"id": 3}, [])))  # never parsed
            proto.write(pack_frame({"id": 9}))
            await asyncio.wait_for(_until(lambda: errors), 10)
            assert [f.header["id"] for f in got] == [1, 2]
            assert "exceeds the maximum frame size" in str(errors[0])
            b.settimeout(10)
            assert read_frame_sync(b, 1000).header == {"id": 9}
        await asyncio.wait_for(closed.wait(), 10)
        assert proto.closed and not proto.write(pack_frame({"id": 10}))

    asyncio.run(main())


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    while not predicate():
        await asyncio.sleep(0.01)


def test_socket_reader_lands_every_payload_on_a_64_byte_boundary() -> None:
    # Frames with 64 header lengths in one burst: the buffered ones and the last alike.
    a, b = socket.socketpair()
    with a, b:
        x = np.arange(16, dtype=np.float32)
        metas, blobs = encode_tensors({"x": x})
        for pad in range(64):
            a.sendmsg(pack_frame({"op": "infer", "pad": "p" * pad, "tensors": metas}, blobs))
        reader = SocketFrameReader(b, 1 << 20)
        for pad in range(64):
            frame = reader.read()
            assert frame.header["pad"] == "p" * pad
            assert np.frombuffer(frame.payload, np.uint8).ctypes.data % 64 == 0
            assert decode_tensors(frame.header["tensors"], frame.payload)["x"].tolist() == (
                x.tolist()
            )


def test_large_frames_go_whole_through_a_socket_with_a_timeout() -> None:
    # A socket with a timeout sends only part of a big frame per sendmsg; nothing may be lost.
    a, b = socket.socketpair()
    a.settimeout(30)
    big = np.random.default_rng(0).integers(0, 255, 12 * 1024 * 1024, dtype=np.uint8)
    metas, blobs = encode_tensors({"x": big})
    got: list = []

    def read() -> None:
        reader = SocketFrameReader(b, 64 << 20, chunk=4096)
        got.append(reader.read())
        got.append(reader.read())

    with a, b:
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        send_frame(a, pack_frame({"op": "infer", "tensors": metas}, blobs))
        send_frame(a, pack_frame({"op": "ping"}))
        thread.join(30)
        assert not thread.is_alive()
    payload = got[0].payload
    assert np.frombuffer(payload, np.uint8).ctypes.data % 64 == 0
    assert np.array_equal(decode_tensors(got[0].header["tensors"], payload)["x"], big)
    assert got[1].header == {"op": "ping"}


@pytest.mark.parametrize(
    "header",
    [
        {"op": "infer", "tensors": [{"name": "x", "shape": [1, 64], "nbytes": 256}], "id": 3},
        {"op": "text", "text": {"prompt": "é ☃ " * 50}, "deadline": 12.000001, "id": 4},
        {"ok": True, "digest": None, "values": [4.1e-05, float("nan"), 2**70], "id": 5},
    ],
)
def test_header_bytes_is_the_size_pack_frame_writes(header: dict) -> None:
    """The router refuses a header the worker could not read by this size: it must be the
    one sent (orjson writes non-ASCII as UTF-8, the stdlib escaped)."""
    (head_len,) = struct.unpack_from(">I", b"".join(pack_frame(header)), 4)
    assert header_bytes(header) == head_len
    assert unpack_body(b"".join(pack_frame(header))[4:]).header.keys() == header.keys()

"""The declared-size check on chunked bodies (http/chunk_limit.py), on aiohttp's own parser.

The same byte streams are fed whole, in 7-byte pieces and byte by byte: the tracker must
read the framing exactly as llhttp does wherever the reads split, refuse only the body
whose chunks declare more than the limit, and stay in step for the requests after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.http_parser import HttpRequestParser

from hotreload.http.body import BodyError
from hotreload.http.chunk_limit import ChunkLimitParser

LIMIT = 1000


class _Protocol:
    transport = None

    def pause_reading(self, **_: Any) -> None:
        pass

    def resume_reading(self, **_: Any) -> None:
        pass


def chunked(*sizes: int, head: bytes = b"", trailers: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n" % n + b"\r\n" * (n // 2) + b"x" * (n % 2) + b"\r\n" for n in sizes)
    return (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        + head
        + b"\r\n"
        + body
        + b"0\r\n"
        + trailers
        + b"\r\n"
    )


def with_length(body: bytes) -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def feed(stream: bytes, size: int) -> tuple[list[str | None], int]:
    """Each request's refusal (None: none) and how often the connection was told to close."""
    loop = asyncio.new_event_loop()
    try:
        told: list[int] = []
        inner = HttpRequestParser(_Protocol(), loop, 2**16, max_line_size=8190, max_field_size=8190)
        parser = ChunkLimitParser(inner, LIMIT, lambda: told.append(1))
        payloads = []
        for piece in pieces(stream, size or len(stream)):
            messages, _, _ = parser.feed_data(piece)
            payloads += [p for _, p in messages]
        out = []
        for p in payloads:
            exc = p.exception()
            assert exc is None or (isinstance(exc, BodyError) and exc.status == 413)
            out.append(None if exc is None else exc.message)
        return out, len(told)
    finally:
        loop.close()


@pytest.mark.parametrize("size", [0, 7, 1])
def test_only_the_body_declaring_too_much_is_refused_and_the_next_requests_follow(
    size: int,
) -> None:
    stream = (
        # Body bytes that look like a chunk-size line must not be read as one.
        with_length(b"FFFFFF\r\n" * 20)
        + chunked(300, 300, trailers=b"X-Sum: 1\r\n")  # within the limit, with trailers
        + b"\r\n"  # an empty line between requests
        + chunked(10, head=b"X-A: b\r\n")
        + chunked(600, 500)  # 1100 declared: refused at the second size line
        + b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    refused, told = feed(stream, size)
    assert refused[:3] == [None, None, None] and refused[4] is None, refused
    assert refused[3] is not None and "declares at least 1100 bytes" in refused[3]
    assert "over the 1000-byte limit" in refused[3] and told == 1


@pytest.mark.parametrize("size", [0, 1])
def test_one_chunk_declaring_too_much_is_refused_before_its_bytes(size: int) -> None:
    head = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    refused, _ = feed(head + b"FFFFFFFF;name=value\r\nabc", size)
    assert refused[0] is not None and f"{0xFFFFFFFF}" in refused[0]


def test_framing_it_does_not_follow_turns_it_off() -> None:
    # An upgrade may change the protocol: the limit then applies as bytes arrive, as before.
    stream = chunked(2000, head=b"Upgrade: h2c\r\nConnection: upgrade\r\n")
    assert feed(stream, 0) == ([None], 0)


def test_a_parser_without_message_consumed_still_wraps() -> None:
    """aiohttp before 3.14 has no `message_consumed` on its parsers: wrapping one must not
    fail every connection (the method is bound only where the parser has it)."""

    class OldParser:
        def feed_data(self, data: bytes) -> tuple[list[Any], bool, bytes]:
            return [], False, b""

    wrapped = ChunkLimitParser(OldParser(), 10, lambda: None)
    assert wrapped.feed_data(b"GET / HTTP/1.1\r\n") == ([], False, b"")
    with pytest.raises(AttributeError):
        wrapped.message_consumed  # noqa: B018 - asked only of parsers that have it


def plain_chunked(*sizes: int) -> bytes:
    head = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (n, b"y" * n) for n in sizes) + b"0\r\n\r\n"


def test_a_read_of_one_whole_request_is_not_followed_and_the_next_chunked_one_is() -> None:
    """A read holding one request with a Content-Length body (what clients send) needs no
    following: the tracker stays in step without reading it, and still refuses the chunked
    body after it that declares too much, however the reads fall."""
    reads = [
        with_length(b"7FFFFFFF\r\n" * 3 + b"\r\n\r\n"),  # a body that looks like framing
        b"\r\n" + with_length(b""),  # an empty line before a request, as RFC 9112 allows
        b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n",
        plain_chunked(600, 500),  # 1100 declared: refused
        with_length(b"z" * 40)[:30],  # one request over two reads: followed
        with_length(b"z" * 40)[30:],
        plain_chunked(300) + with_length(b"{}"),  # two in one read: followed
        with_length(b"0\r\n\r\n" * 4),
    ]
    loop = asyncio.new_event_loop()
    try:
        told: list[int] = []
        inner = HttpRequestParser(_Protocol(), loop, 2**16, max_line_size=8190, max_field_size=8190)
        parser = ChunkLimitParser(inner, 1000, lambda: told.append(1))
        followed: list[bytes] = []
        follow = parser._follow

        def counting(data: bytes, messages: Any) -> None:
            followed.append(data)
            follow(data, messages)

        parser._follow = counting  # type: ignore[method-assign]
        payloads = []
        for data in reads:
            payloads += [p for _, p in parser.feed_data(data)[0]]
    finally:
        loop.close()
    refused = [p.exception() for p in payloads]
    assert [exc is None for exc in refused] == [True, True, True, False, True, True, True, True]
    assert isinstance(refused[3], BodyError) and "declares at least 1100" in refused[3].message
    assert told == [1]
    assert followed == [reads[3], reads[4], reads[5], reads[6]]

"""Reading a request body with limits: a deadline for the whole body, and gzip/deflate
inflated here (aiohttp's own decompression is off) with the inflated size checked while
inflating.

aiohttp inflates a compressed body as it arrives, on the event loop, and after refusing one
it reads (and so inflates) the rest of it for up to 10 s before closing: a 1 MiB gzip bomb
of 1 GiB cost the loop seconds each, and every other request waited (valid requests took
2-3 s while bombs were refused). Here the raw body is read (at most `client_max_size`
bytes), then inflated in one call that stops at the limit, in a thread when the body is
large: the loop only ever copies bytes, and a bomb costs at most the limit's worth of
inflating, off the loop.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from aiohttp import web

#: Compressed bodies above this are inflated in a thread (zlib releases the GIL there);
#: smaller ones inflate faster than a thread hop.
INFLATE_IN_THREAD_ABOVE = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True)
class BodyLimits:
    """What a request body may cost (`[http]` in the config)."""

    #: Seconds from the handler's first read to the body's last byte.
    timeout_s: float
    #: Largest body after gzip/deflate inflation, in bytes.
    max_inflated_bytes: int


class BodyError(Exception):
    """A body refused: answered with `status` and `message`, then the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class ClientGone(BodyError):
    """The client closed its connection before the body's end: nobody reads an answer, and
    no traceback is due (any local user can do it at will); the server says it in one line."""


async def read_body(request: web.Request, limits: BodyLimits) -> bytes:
    """The request body, inflated, or BodyError (408 late, 413 too large, 415/400 bad
    encoding, ClientGone when the client hung up). aiohttp's own 413 for a raw body over
    `client_max_size` passes through."""
    try:
        if request.content.is_eof():
            # Every byte is in (a small body, usually): the read cannot wait, so no deadline
            # is due, and wait_for would run it as a task of its own (two more loop turns).
            raw = await request.read()
        else:
            raw = await asyncio.wait_for(request.read(), limits.timeout_s)
    except TimeoutError:
        raise BodyError(
            408,
            f"the request body did not arrive within {limits.timeout_s:g} s "
            "(body_timeout_s under [http] in the config)",
        ) from None
    except ConnectionError:
        length = request.content_length
        of = f" of {length} bytes" if length is not None else ""
        raise ClientGone(
            400, f"the client closed the connection before the end of its body{of}"
        ) from None
    except web.RequestPayloadError as exc:  # a chunked body cut short or malformed
        raise BodyError(400, f"the request body cannot be read: {exc}") from None
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in _WBITS:
        raise BodyError(
            415, f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or none"
        )
    if len(raw) > INFLATE_IN_THREAD_ABOVE:
        return await asyncio.to_thread(inflate, raw, encoding, limits.max_inflated_bytes)
    return inflate(raw, encoding, limits.max_inflated_bytes)


#: Answers up to this size are compressed here, with a window and a hash table sized to
#: them; larger ones by aiohttp (`enable_compression`, zlib's defaults). zlib's defaults (a
#: 32 KiB window, 64 Ki hash heads, set up and cleared for each answer) cost 170,000
#: instructions for a 400-byte KServe answer; sized, 126,000, and nothing is lost: a
#: window as long as the body reaches all of it.
SMALL_ANSWER_BYTES = 16 * 1024
#: Answers up to this size go in stored deflate blocks: still the coding the client asked
#: for, not made smaller. Compressing one (a 1x10 answer: 400 bytes to 280) saves no packet,
#: as it fits one either way, and its Huffman trees alone cost 120,000 instructions, an
#: eighth of the HTTP front's work per request; stored, 12,000.
STORED_ANSWER_BYTES = 1024


def compress_small(body: bytes, accept: str) -> tuple[bytes, str] | None:
    """`body` in the content coding aiohttp's `enable_compression` would send for an
    `Accept-Encoding` of `accept` that names gzip or deflate (deflate when named, else
    gzip; q-values not read, as aiohttp does not), and that coding. None for a body over
    SMALL_ANSWER_BYTES (left to aiohttp)."""
    if len(body) > SMALL_ANSWER_BYTES:
        return None
    coding = "deflate" if "deflate" in accept.lower() else "gzip"
    bits = max(9, (len(body) - 1).bit_length())  # zlib's smallest window is 512 bytes
    wbits = bits + 16 if coding == "gzip" else bits  # gzip's wrapper, or zlib's (deflate)
    level = 0 if len(body) <= STORED_ANSWER_BYTES else zlib.Z_DEFAULT_COMPRESSION
    packer = zlib.compressobj(level, zlib.DEFLATED, wbits, max(1, bits - 7))
    return packer.compress(body) + packer.flush(), coding


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """Inflate a gzip or deflate body, never producing more than `limit` + 1 bytes."""
    wbits = _WBITS[encoding]
    if encoding == "deflate" and data[:1] and data[0] & 0x0F != 8:
        wbits = -zlib.MAX_WBITS  # raw deflate without the zlib header, as some clients send
    out = bytearray()
    try:
        while True:  # a gzip body may hold several members back to back
            d = zlib.decompressobj(wbits)
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit or d.unconsumed_tail:
                raise BodyError(
                    413,
                    f"the body inflates to more than {limit} bytes ({encoding}); the limit is "
                    "max_inflated_mib under [http] (or max_frame_mib) in the config",
                )
            if not d.eof:
                raise BodyError(400, f"the {encoding} body is cut short")
            data = d.unused_data
            if not data:
                return bytes(out)
    except zlib.error as exc:
        raise BodyError(400, f"the body is not valid {encoding}: {exc}") from None

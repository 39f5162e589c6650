"""A chunked body that declares more than the body limit is refused at once (413).

aiohttp counts a body against `client_max_size` only as its bytes arrive: a client that
declares a 256 MiB chunk and then sends slowly held its connection until the body
deadline (408 after 60 s), although the declared size alone says the body is too large.
aiohttp's C parser (llhttp) never shows the declared chunk size, and its Python parser
costs 4x as much per request, so the connection's parser is wrapped here instead: the
C parser stays the parser, and this follows the same bytes beside it just far enough to
read each declared chunk size. Each message's framing (Content-Length or chunked) is the
one llhttp parsed: only where its head ends and the chunk-size lines are read here. When
a message's chunks declare more than the limit, its body stream gets BodyError(413) (the
handler reading it answers 413 and closes) and the connection is closed after the
response instead of reading the rest.

It only ever refuses what the limit would refuse once the bytes arrived. Whatever it does
not follow exactly (an upgrade, a head llhttp has not returned yet, a line too long) turns
it off for the connection: the limit then applies as before, as bytes arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hotreload.http.body import BodyError

#: A message head or a chunk-size line longer than this turns the tracking off (aiohttp's
#: own limits refuse far shorter lines; its headers are at most 128 of 8190 bytes).
MAX_HEAD_BYTES = 128 * 8192
MAX_SIZE_LINE = 8192

_HEAD, _BODY, _SIZE, _DATA, _DATA_END, _TRAILERS, _OFF = range(7)


class _Message:
    """A chunked request's body as the tracker follows it."""

    __slots__ = ("declared", "payload")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.declared = 0


class ChunkLimitParser:
    """The connection's HTTP parser, with a declared-size check on chunked bodies.
    Everything but `feed_data` goes to the wrapped parser untouched."""

    def __init__(self, parser: Any, limit: int, on_over: Callable[[], None]) -> None:
        self._parser = parser
        self._limit = limit
        self._on_over = on_over
        self._state = _HEAD
        self._buf = bytearray()
        self._left = 0  # bytes to skip in _BODY / _DATA
        self._current: _Message | None = None
        # Called once a request: bound here, where `__getattr__` cost a Python call each
        # (aiohttp 3.14's parsers have it; older ones go through `__getattr__` if asked).
        consumed = getattr(parser, "message_consumed", None)
        if consumed is not None:
            self.message_consumed = consumed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    def feed_data(self, data: bytes, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._parser.feed_data(data, *args, **kwargs)
        except BaseException:
            self._state = _OFF
            raise
        if self._state != _OFF and data and not self._one_whole_request(data, result[0]):
            try:
                self._follow(bytes(data), iter(result[0]))
            except ValueError:
                self._state = _OFF  # framing not followed exactly: the limit as before
        return result

    def _one_whole_request(self, data: bytes, messages: Sequence[tuple[Any, Any]]) -> bool:
        """Is `data` one whole request without a chunked body, from where the last one
        ended? Most reads are one such request, and then nothing in it is to follow:
        following it cost 5% of the HTTP front's instructions a request, this check half
        that."""
        if self._state != _HEAD or self._buf or len(messages) != 1 or type(data) is not bytes:
            return False
        msg = messages[0][0]
        if msg.chunked or msg.upgrade or msg.method == "CONNECT":
            return False
        # The head ends at the first blank line: llhttp returned its one message, and the
        # read starts where the last message ended.
        end = data.find(b"\r\n\r\n")
        length = msg.headers.get("Content-Length")
        return end >= 0 and end + 4 + (int(length) if length else 0) == len(data)

    # ------------------------------------------------------------------ the framing

    def _follow(self, data: bytes, messages: Iterator[tuple[Any, Any]]) -> None:
        """Follow `data`; `messages`: what the parser returned for it, one per head."""
        i, n = 0, len(data)
        while i < n and self._state != _OFF:
            s = self._state
            if s in (_BODY, _DATA):
                step = min(self._left, n - i)
                i, self._left = i + step, self._left - step
                if not self._left:
                    self._state = _HEAD if s == _BODY else _DATA_END
                continue
            head = s in (_HEAD, _TRAILERS)
            taken = self._line(data, i, b"\r\n\r\n" if head else b"\r\n", head)
            if taken is None:
                return  # the rest of `data` is buffered: the line goes on in the next
            line, i = taken
            if s == _HEAD:
                if line:  # (empty lines between requests are skipped, as RFC 9112 allows)
                    self._head(messages)
            elif s == _SIZE:
                self._size(line)
            elif s == _DATA_END:
                if line:
                    raise ValueError("chunk data longer than its size")
                self._state = _SIZE
            else:  # the trailers, to their blank line
                self._state = _HEAD

    def _line(self, data: bytes, i: int, end: bytes, blank: bool) -> tuple[bytes, int] | None:
        """The line (or head) starting at the buffered bytes, then data[i:], up to `end`,
        and the index in `data` after it; None when `end` is not there yet (then data[i:]
        is buffered). `blank`: an empty line alone counts as one. Searches `data` in place
        unless a line began in an earlier piece (a copy per line would cost quadratic
        time for many small chunks in one read)."""
        cap = MAX_HEAD_BYTES if blank else MAX_SIZE_LINE
        buf = self._buf
        if buf:
            hay, start, off = bytes(buf) + data[i : i + cap + len(end)], 0, len(buf) - i
        else:
            hay, start, off = data, i, 0
        if blank and hay.startswith(b"\r\n", start):
            self._buf = bytearray()
            return b"", start + 2 - off
        at = hay.find(end, start, start + cap + len(end))
        if at < 0:
            if len(buf) + len(data) - i > cap:
                raise ValueError("line too long")
            buf += data[i:]
            return None
        self._buf = bytearray()
        return hay[start:at], at + len(end) - off

    def _head(self, messages: Iterator[tuple[Any, Any]]) -> None:
        """A head ended: its message (llhttp's reading of it) says how its body is framed."""
        parsed = next(messages, None)
        if parsed is None:
            raise ValueError("a head the parser has not returned (paused, or refused)")
        msg, payload = parsed
        if msg.upgrade or msg.method == "CONNECT":
            raise ValueError("the connection may change protocol")
        length = msg.headers.get("Content-Length")
        if msg.chunked:
            self._current, self._state = _Message(payload), _SIZE
        elif length is not None and int(length) > 0:
            self._current, self._state, self._left = None, _BODY, int(length)
        else:
            self._current, self._state = None, _HEAD

    def _size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0]
        if not digits or digits.strip(b"0123456789abcdefABCDEF"):
            raise ValueError("not a chunk size")
        size = int(digits, 16)
        if size == 0:
            self._state, self._current = _TRAILERS, None
            return
        self._state, self._left = _DATA, size
        m = self._current
        if m is None:
            return
        m.declared += size
        if m.declared > self._limit:
            self._current = None  # refused once; its chunks are still followed
            m.payload.set_exception(
                BodyError(
                    413,
                    f"the chunked body declares at least {m.declared} bytes, over the "
                    f"{self._limit}-byte limit (max_frame_mib in the config)",
                )
            )
            self._on_over()

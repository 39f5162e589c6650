"""The HTTP endpoint's answers to requests that never reach a handler.

- A request aiohttp cannot parse (a bad request line, a bad header) gets a JSON 400, as
  every other error does, and no traceback in the log: aiohttp logs one per request at
  error level and answers in text, so a fuzzer filled the log and confused clients. Its
  body has the shape of its path's other errors (OpenAI's error object on `/v1/...`), the
  path read off the request line when there is one.
- aiohttp's own 404/405/413 become JSON, and a 405 keeps the `Allow` header RFC 9110
  requires of it.
- A chunked body that declares more than the body limit is refused at once
  (http/chunk_limit.py), and the connection closes after the 413 without reading the rest.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from hotreload.http.chunk_limit import ChunkLimitParser
from hotreload.http.replies import error_body
from hotreload.protocol.json_read import compact_json

#: A request line (`POST /v1/completions HTTP/1.1`): its path, for a request that failed
#: to parse later on (a bad header), whose error must take the shape of its route's. Not
#: anchored to a line's start: on a keep-alive connection a request follows the last one's
#: body, which need not end in a newline.
_REQUEST_LINE = re.compile(rb"[A-Z]{1,20} (/[^\s?#]*)[^\s]* HTTP/\d\.\d\r?\n")
#: How much of what a connection received last is kept to find that line in.
_KEPT_BYTES = 8192


def parse_error_path(received: bytes) -> str:
    """The path of the last request line in `received` ("/" when none parses)."""
    found = _REQUEST_LINE.findall(received)
    return found[-1].decode("latin-1") if found else "/"


def _json(doc: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=compact_json(doc).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def http_exception_response(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's error for a request (404, 405, 413) as JSON, its `Allow` header kept."""
    text = exc.text or exc.reason
    headers = {}
    if exc.status == 404:
        text = f"no such endpoint: {request.method} {request.path}"
    elif exc.status == 405:
        allow = exc.headers.get("Allow", "")
        text = f"{request.method} is not allowed on {request.path}; allowed: {allow or 'none'}"
        headers["Allow"] = allow
    return _json(error_body(request.path, exc.status, text), exc.status, headers)


class _JsonErrorHandler(RequestHandler):
    def __init__(self, manager: Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        #: The tail of what this connection received (see `data_received`).
        self._received = bytearray()
        limit = getattr(manager, "max_body_bytes", None)
        if limit:
            self._parser = ChunkLimitParser(self._parser, limit, self._close_after_response)

    def data_received(self, data: bytes) -> None:
        # Kept before parsing: a request that fails to parse names no path to aiohttp.
        # Only a tail is copied: a large body's chunks cost no more than _KEPT_BYTES each,
        # and a request's own bytes are copied once (the tail is cut back to _KEPT_BYTES
        # once it holds twice that, not rebuilt on every read).
        received = self._received
        received += data[-_KEPT_BYTES:]
        if len(received) > 2 * _KEPT_BYTES:
            del received[:-_KEPT_BYTES]
        super().data_received(data)

    def _close_after_response(self) -> None:
        # A body refused for its declared size is not read on: aiohttp would read the rest
        # for up to 10 s after the response ("lingering"); the connection closes instead.
        self._lingering_time = 0.0

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400:
            return super().handle_error(request, status, exc, message)
        # A client's malformed request is no fault of ours: debug, not an error traceback.
        self.logger.debug("malformed HTTP request from %s: %s", request.remote, exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was sent already: the connection is broken")
        path = parse_error_path(bytes(self._received[-_KEPT_BYTES:]))
        text = f"malformed HTTP request: {message or exc or 'bad request'}"
        resp = _json(error_body(path, 400, text), 400)
        resp.force_close()
        return resp


def close_without_lingering(request: web.Request) -> None:
    """The connection closes right after `request`'s answer, its body not read on: for a
    body that stopped arriving (the 408), which aiohttp would otherwise wait on for up to
    10 s more ("lingering"), holding the connection for nothing."""
    handler = request.protocol
    if isinstance(handler, _JsonErrorHandler):
        handler._close_after_response()


class _JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


def answer_parse_errors_in_json(runner: web.AppRunner, max_body_bytes: int | None = None) -> None:
    """Make a set-up runner's connections answer unparsable requests with a JSON 400, and
    refuse a chunked body declaring more than `max_body_bytes` at once (413)."""
    server = runner.server
    if server is not None and type(server) is Server:
        server.__class__ = _JsonErrorServer
        server.max_body_bytes = max_body_bytes  # type: ignore[attr-defined]

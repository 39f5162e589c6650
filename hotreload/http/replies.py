"""How the HTTP front answers: JSON bodies, errors as `{"error": ...}` with their status."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from hotreload.errors import (
    BadRequestError,
    ClientError,
    ModelError,
    QueueFullError,
    RequestTimeoutError,
    WorkerUnavailableError,
)


class HttpError(Exception):
    """Answered as `{"error": message}` with `status` (and any extra fields); `close`: the
    connection closes after the answer (a body not read to its end cannot be skipped)."""

    def __init__(self, status: int, message: str, *, close: bool = False, **extra: Any) -> None:
        self.status = status
        self.message = message
        self.close = close
        self.extra = extra
        super().__init__(message)


def json_response(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(doc, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def _status_for(exc: ClientError) -> int:
    if isinstance(exc, BadRequestError):
        return 400
    if isinstance(exc, RequestTimeoutError):
        return 504
    if isinstance(exc, (QueueFullError, WorkerUnavailableError)):
        return 503
    return 500


def client_error(exc: ClientError) -> HttpError:
    if isinstance(exc, ModelError):
        # str(ModelError) appends the traceback for terminals; JSON gets it as its own field.
        message = str(exc).split("\n--- remote traceback ---", 1)[0]
        return HttpError(500, message, traceback=exc.remote_traceback)
    return HttpError(_status_for(exc), str(exc))

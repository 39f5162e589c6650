"""How the HTTP front answers: JSON bodies, and errors with their status.

An error's body depends on the route it answers. The OpenAI and vLLM-style routes (`/v1/...`,
`/tokenize`, `/detokenize`, `/tokenizer_info`, `/health`) answer OpenAI's error object,
`{"error": {"message", "type", "param", "code"}}`: the `openai` SDK prints `message` in its
exception (a plain string there left it saying only "Error code: 400"). The KServe v2 routes
keep `{"error": "<message>"}`, the shape the Open Inference Protocol specifies.
"""

from __future__ import annotations

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
from hotreload.protocol.json_read import compact_json

#: Paths outside `/v1/` that answer errors as OpenAI objects: vLLM's own routes, which the
#: same clients call (lm-eval's remote tokenizer, health probes of OpenAI-style servers).
_OPENAI_STYLE_PATHS = frozenset({"/tokenize", "/detokenize", "/tokenizer_info", "/health"})

#: OpenAI's error `type` per status (what its SDK and vLLM send); other 4xx are
#: invalid requests, other 5xx server errors.
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class HttpError(Exception):
    """Answered as an error body (see `error_body`) with `status` and any extra fields;
    `param`: the request field at fault, when one is; `code`: a short machine-readable
    reason; `close`: the connection closes after the answer (a body not read to its end
    cannot be skipped)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        close: bool = False,
        param: str | None = None,
        code: str | None = None,
        **extra: Any,
    ) -> None:
        self.status = status
        self.message = message
        self.close = close
        self.param = param
        self.code = code
        self.extra = extra
        super().__init__(message)


def openai_style(path: str) -> bool:
    """Does `path` answer errors as OpenAI error objects (not the KServe v2 shape)?"""
    return path == "/v1" or path.startswith("/v1/") or path in _OPENAI_STYLE_PATHS


def error_type(status: int) -> str:
    """OpenAI's `type` for an error answered with `status`."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The body of an error answered on `path`: OpenAI's error object on the OpenAI-style
    routes, `{"error": message}` on the others; `extra` (a traceback) beside `error`."""
    if not openai_style(path):
        return {"error": message, **extra}
    error = {"message": message, "type": error_type(status), "param": param, "code": code}
    return {"error": error, **extra}


def json_response(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=compact_json(doc).encode(),
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
        return HttpError(500, message, code=exc.code, traceback=exc.remote_traceback)
    # A worker's 400 may name the request field at fault (a prompt past the context).
    param = getattr(exc, "param", None)
    return HttpError(_status_for(exc), str(exc), code=exc.code, param=param)

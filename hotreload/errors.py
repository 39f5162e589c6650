"""Exceptions a user of hotreload sees. Every message says what went wrong and what to do."""

from __future__ import annotations

import difflib


def did_you_mean(name: str, candidates: list[str]) -> str:
    """`; did you mean 'build'?` for the closest candidate, or "" when none is close."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class HotreloadError(Exception):
    """Base class of every error hotreload raises on purpose."""


class ConfigError(HotreloadError):
    """The config file is missing or wrong. The message names the file, the key and the fix."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        self.path = path
        self.key = key
        where = ""
        if path:
            where = f"{path}: "
        if key:
            where += f"{key}: "
        super().__init__(where + message)


class ProtocolError(HotreloadError):
    """A frame or message did not follow the wire protocol."""


class ClientError(HotreloadError):
    """Base class of errors a client gets back for a request."""

    code = "error"


class NoServerError(ClientError):
    """Nothing is listening on the session socket."""

    code = "no_server"


class QueueFullError(ClientError):
    """The model's bounded queue is full; the request was rejected at once."""

    code = "queue_full"


class RequestTimeoutError(ClientError):
    """The request did not complete within its timeout."""

    code = "timeout"


class BadRequestError(ClientError):
    """The request was malformed: unknown model, wrong dtype or shape, bad frame."""

    code = "bad_request"


class ModelError(ClientError):
    """The model raised while computing the request; carries the remote traceback."""

    code = "model_error"

    def __init__(self, message: str, remote_traceback: str | None = None) -> None:
        self.remote_traceback = remote_traceback
        text = message
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)


class WorkerUnavailableError(ClientError):
    """The model's worker died and the request could not be served after one retry."""

    code = "worker_unavailable"


class ReloadFailedError(ClientError):
    """A reload asked for by the client failed; the previous version keeps serving."""

    code = "reload_failed"


class StaleBaseError(ClientError):
    """A push of the changed tensors only was made for weights that no longer serve (the
    weights files changed, or the session restarted): nothing was built; push everything."""

    code = "stale_base"


class PushSupersededError(ClientError):
    """A push made without waiting was replaced, before it was sent, by a later one
    (`superseded_by` is the later push's handle): the trainer never queues a backlog."""

    code = "superseded"

    def __init__(self, message: str, superseded_by: object = None) -> None:
        super().__init__(message)
        self.superseded_by = superseded_by


#: Maps the `code` field of an error reply to the exception a client raises.
ERROR_CLASSES: dict[str, type[ClientError]] = {
    cls.code: cls
    for cls in (
        ClientError,
        NoServerError,
        QueueFullError,
        RequestTimeoutError,
        BadRequestError,
        ModelError,
        WorkerUnavailableError,
        ReloadFailedError,
        StaleBaseError,
        PushSupersededError,
    )
}

"""What the worker says about failures: error replies, the user's traceback, and handing
freed heap back to the OS after a version is dropped."""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable
from typing import Any

from hotreload.protocol.framing import pack_spilling
from hotreload.protocol.messages import DigestReply, SyncReply
from hotreload.worker.loader import LoadError

_INTERNAL = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "<frozen importlib")


def user_traceback(exc: BaseException) -> str:
    """The traceback without hotreload's and importlib's own frames: the user's code first.
    An exception raised in hotreload's own code (not a LoadError: a bug, or a model it does
    not handle yet) keeps every frame: without them it was one line nobody could place."""
    te = traceback.TracebackException.from_exception(exc)
    ours = bool(te.stack) and te.stack[-1].filename.startswith(_INTERNAL[0])
    # A SyntaxError in the user's file has no user frame at all: its own lines show where.
    if not ours:
        te.stack = traceback.StackSummary.from_list(
            [f for f in te.stack if not f.filename.startswith(_INTERNAL)]
        )
    return "".join(te.format())


def after_reply(fn: Any, *args: Any) -> None:
    """`fn(*args)` once its op was answered: a failure goes to the worker's log (stderr,
    the session's log file), not into a second reply to a request answered already."""
    try:
        fn(*args)
    except Exception:
        traceback.print_exc()


def return_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them for reuse otherwise)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim from the symbols already loaded, or None (not glibc). Looked up
    once: `ctypes.util.find_library` runs `ldconfig` in a subprocess on every call."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def message_of(exc: BaseException) -> str:
    if isinstance(exc, LoadError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def error_header(rid: Any, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """A failed reply's header: `{"id", "ok": false, "error": {code, message, ...}}`."""
    return {"id": rid, "ok": False, "error": {"code": code, "message": message, **extra}}


def reply_pieces(header: dict[str, Any], blobs: list[Any], max_frame: int) -> list[Any]:
    """A reply's frame, its header in the payload when too large for a header (a long
    prompt's tokens, echoed logprobs), or, when the whole would pass the `max_frame` bytes
    the session reads, an error that says so: the session never gets a frame it must refuse
    (which would cost the channel, and so the worker and every request on it)."""
    pieces = pack_spilling(header, blobs)
    size = int.from_bytes(bytes(pieces[0][:4]), "big")  # the body length its prefix says
    if size <= max_frame:
        return pieces
    message = (
        f"the answer is {size} bytes, over the {max_frame}-byte frame limit (max_frame_mib "
        "in the config); ask for less in one request (fewer prompts or logprobs, a shorter "
        "prompt, a smaller batch)"
    )
    return pack_spilling(error_header(header.get("id"), "bad_request", message))


def answer_bad(send: Callable[[dict[str, Any]], None]) -> Callable[[Exception], None]:
    """What the worker's reader does with a frame it cannot read (too large): answer it, by
    its id where it has one, and read on. A worker never dies for one frame."""

    def answer(exc: Exception) -> None:
        send(error_header(getattr(exc, "request_id", None), "bad_request", str(exc)))

    return answer


def sync_version(device: Any, mv: Any, deadline_s: float) -> SyncReply:
    """The SYNC reply for version `mv` (None: every stream): its CUDA streams synced within
    `deadline_s` (worker/sync.py), or skipped on the CPU."""
    if device.type != "cuda":
        return SyncReply(skipped=True, reason="CPU device: no CUDA streams")
    from hotreload.worker.sync import sync_streams  # cuda-python: only where CUDA is

    return sync_streams(mv.version if mv else None, deadline_s)


def digest_reply(mv: Any, digest: str) -> DigestReply:
    """Op DIGEST's answer once the version's hashing is done: the digest, its adapters'
    (the base's is in now), the bytes it hashed, and the leaves of the weights block it
    read the files into and of its pushes (the session hands them to the next worker that
    maps them: worker/shared_weights.py)."""
    block = mv.weights.shared
    return DigestReply(
        digest=digest,
        hashed_bytes=mv.hashed_bytes,
        adapters=mv.weights.adapters.wire() if mv.weights.adapters is not None else None,
        block_leaves=block.leaves if block is not None and block.leaves else None,
        overlay_leaves=mv.weights.overlay_leaves or None,
    )

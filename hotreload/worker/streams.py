"""Waiting for CUDA streams to go idle, with a deadline.

`cudaStreamSynchronize` can block forever on a wedged stream, so the worker's sync phase
polls `cudaStreamQuery` instead and gives up at a deadline, naming the streams still busy.
The polling is plain Python over `StreamRef.query` callables: raw stream handles go through
cuda-python (`raw_stream_ref`), torch streams through torch (`torch_stream_ref`). Both
imports happen lazily, inside the worker process that already has them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class StreamQueryError(RuntimeError):
    """cudaStreamQuery returned something other than "idle" or "busy"."""


@dataclass(frozen=True)
class StreamRef:
    """A stream to wait for: a name for reports and a query that is True when idle."""

    name: str
    query: Callable[[], bool]


@dataclass(frozen=True)
class SyncOutcome:
    """Result of `wait_streams_idle`."""

    #: True when every stream was idle before the deadline.
    idle: bool
    #: Names of the streams still busy at the deadline (empty when `idle`).
    busy: tuple[str, ...]
    waited_s: float
    polls: int


def _cudart() -> Any:
    # cuda-python moved the runtime bindings: cuda.bindings.runtime (>= 12.6) replaces
    # cuda.cudart. Pick whichever this install has.
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[no-redef]
        except ImportError as exc:
            raise StreamQueryError(
                f"cuda-python is not importable ({exc}); install cuda-python to sync raw streams"
            ) from exc
    return runtime


def raw_stream_ref(name: str, handle: int) -> StreamRef:
    """A StreamRef for a raw `cudaStream_t` handle (an int), queried through cuda-python."""
    rt = _cudart()
    success = rt.cudaError_t.cudaSuccess
    not_ready = rt.cudaError_t.cudaErrorNotReady
    stream = rt.cudaStream_t(handle) if hasattr(rt, "cudaStream_t") else handle

    def query() -> bool:
        result = rt.cudaStreamQuery(stream)
        err = result[0] if isinstance(result, tuple) else result
        if err == success:
            return True
        if err == not_ready:
            return False
        detail = ""
        try:
            _, msg = rt.cudaGetErrorString(err)
            detail = f": {msg.decode() if isinstance(msg, bytes) else msg}"
        except Exception:
            pass
        raise StreamQueryError(f"cudaStreamQuery on stream {name!r} failed with {err}{detail}")

    return StreamRef(name, query)


def torch_stream_ref(name: str, stream: Any) -> StreamRef:
    """A StreamRef for a `torch.cuda.Stream` (its `query()` is True when idle)."""
    return StreamRef(name, lambda: bool(stream.query()))


def wait_streams_idle(
    streams: Sequence[StreamRef],
    deadline_s: float,
    poll_interval_s: float = 0.001,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SyncOutcome:
    """Poll every stream until all are idle or `deadline_s` has passed.

    A stream seen idle is not queried again: work queued on it later is the new version's
    business, not the old one's. A query error propagates (StreamQueryError): a stream in an
    error state is not "busy", it is broken, and the caller should escalate.
    """
    start = clock()
    pending = list(streams)
    polls = 0
    while True:
        polls += 1
        pending = [s for s in pending if not s.query()]
        elapsed = clock() - start
        if not pending:
            return SyncOutcome(True, (), elapsed, polls)
        if elapsed >= deadline_s:
            return SyncOutcome(False, tuple(s.name for s in pending), elapsed, polls)
        sleep(min(poll_interval_s, max(deadline_s - elapsed, 0.0)))

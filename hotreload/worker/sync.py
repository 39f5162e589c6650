"""The reload's sync phase: wait, with a deadline, for a version's CUDA streams to go idle.

Polls `query()` instead of calling `synchronize()`, because `cudaStreamSynchronize` on a
stream stuck behind a hung kernel never returns; past the deadline the busy streams are
named and the manager treats the worker as wedged.
"""

from __future__ import annotations

from hotreload import runtime
from hotreload.protocol.messages import SyncReply
from hotreload.worker.streams import StreamRef, raw_stream_ref, wait_streams_idle


def _ref(reg: runtime.RegisteredStream) -> StreamRef:
    if isinstance(reg.stream, int):
        return raw_stream_ref(reg.name, reg.stream)
    return StreamRef(reg.name, reg.stream.query)


def sync_streams(version: int | None, deadline_s: float) -> SyncReply:
    refs = [_ref(r) for r in runtime.streams_for(version)]
    outcome = wait_streams_idle(refs, deadline_s)
    return SyncReply(
        idle=outcome.idle,
        busy=list(outcome.busy),
        streams=[r.name for r in refs],
        waited_s=outcome.waited_s,
    )

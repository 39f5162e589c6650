"""The ops the engine sends a worker over its control socket, named once for both ends.

The engine sends them through its port (engine/worker_port.py: a method per control op,
`submit` for the router's INFER and TEXT frames); `worker/server.py` routes them to the
thread that owns each. A `StrEnum`: a member is the very string on the wire, so headers
stay plain JSON and a worker compares what it reads against these names; a misspelt op
fails where it is written, not in the worker.
"""

from __future__ import annotations

from enum import StrEnum


class WorkerOp(StrEnum):
    """One op of the engine -> worker protocol (the reply carries the request's id)."""

    #: A forward on the serving version (the request path; tensors travel with it).
    INFER = "infer"
    #: Build a version (import the code, load weights) as the staged one.
    LOAD = "load"
    #: Warm-up passes on the staged version, or on the serving one (`target`).
    WARM = "warm"
    #: Check the staged version's output against the serving one's.
    SMOKE = "smoke"
    #: Make the staged version the serving one (`inband`: on the serving thread).
    SWAP = "swap"
    #: Drop a version (`which`: retired, staged or current) and free its memory.
    RELEASE = "release"
    #: Move the serving version's weights off the device before a build (the "resource"
    #: policy); it becomes the retired one.
    OFFLOAD = "offload"
    #: Drop every version and wait idle: a worker retired by a respawn reload becomes the
    #: standby that builds the next version.
    RETIRE = "retire"
    #: Put the offloaded version back on the device (its reload failed).
    RESTORE = "restore"
    #: Wait, to a deadline, for a version's CUDA streams to go idle.
    SYNC = "sync"
    #: Memory, allocator and version figures.
    STATUS = "status"
    #: The serving version's weights digest, once its background hashing is done.
    DIGEST = "digest"
    #: Write the serving version's weights to a folder as safetensors (`hotreload save`).
    SAVE = "save"
    #: Score the serving version with the config's `eval` (a dict of floats), on a thread
    #: of its own: never on the request path, and a slow eval holds up no build.
    EVAL = "eval"
    #: Liveness: answered at once by the control thread.
    PING = "ping"
    #: Exit.
    SHUTDOWN = "shutdown"
    #: Text on the serving version (completions, tokenize, detokenize, tokenizer info),
    #: on the serving thread: `text` holds the request (worker/text_op.py).
    TEXT = "text"
    #: Stop a streamed `text` request (`target`: its id) at its next token. Read by the
    #: worker's reader thread, answered at once: the serving thread is the one decoding.
    CANCEL = "cancel"

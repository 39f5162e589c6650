"""Every control op's request and reply, one dataclass each, shared by both ends.

The engine builds a request and sends `request.wire()`; the worker reads it back with
`Request.from_wire(header)` and answers `reply.wire()`, which the engine reads with
`Reply.from_wire(header)`. `from_wire` checks each field against its annotation and fails
loudly, naming the op and the field, when a required one is missing or of the wrong type:
a message that changed shape on one side is never read with silent defaults on the other.
Fields a class does not declare are ignored (a newer peer).

`OPS` pairs each op with its request and reply: the port (engine/worker_port.py) has one
method per entry, and the scripted fake worker of the tests builds the same classes. The
request path (INFER, TEXT: tensors and text, answered by callback in the router's loop
turn) stays plain headers; its speed is the point of it. A streamed `text` request is
answered by several frames with its id: `PARTIAL` ones, then the final reply.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from hotreload.errors import ProtocolError
from hotreload.protocol.ops import WorkerOp

M = TypeVar("M", bound="Message")
R = TypeVar("R", bound="Reply")


@dataclass
class Message:
    """Base of the typed messages: `wire()` and `from_wire()` in one place."""

    op: ClassVar[WorkerOp]

    def wire(self) -> dict[str, Any]:
        """The fields as a header carries them (the sender adds `op`, `id` and `ok`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls: type[M], header: dict[str, Any]) -> M:
        """The message in `header`; ProtocolError names a required field that is missing
        or a field not of its declared type."""
        values: dict[str, Any] = {}
        checks = _checks(cls)
        for f in dataclasses.fields(cls):
            value = header.get(f.name)
            if value is None:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ProtocolError(f"{cls._kind()} without its field {f.name!r}: {header!r}")
                continue
            kind, nested = checks[f.name]
            if kind is not None and not isinstance(value, kind):
                raise ProtocolError(
                    f"{cls._kind()} field {f.name!r} is {type(value).__name__}, not "
                    f"{' or '.join(k.__name__ for k in kind)}"
                )
            values[f.name] = nested.from_wire(value) if nested is not None else value
        return cls(**values)

    @classmethod
    def _kind(cls) -> str:
        return f"{cls.op} {'request' if issubclass(cls, Request) else 'reply'}"


@dataclass
class Reply(Message):
    """What a worker answers to one op."""


@dataclass
class Request(Message, Generic[R]):
    """One control op for a worker; `reply` is the class of its answer."""

    reply: ClassVar[type[Reply]]


@functools.cache
def _checks(cls: type[Message]) -> dict[str, tuple[tuple[type, ...] | None, type[Message] | None]]:
    """Per field: the runtime types its value may have (None: not checked) and, for a field
    that is itself a message, its class (its dict is read into one)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[tuple[type, ...] | None, type[Message] | None]] = {}
    for f in dataclasses.fields(cls):
        kinds: list[type] = []
        nested: type[Message] | None = None
        hint = hints[f.name]
        options = typing.get_args(hint) if _is_union(hint) else (hint,)
        for option in options:
            base = typing.get_origin(option) or option
            if base is Any:
                kinds = []
                break
            if isinstance(base, type) and issubclass(base, Message):
                nested, base = base, dict
            if base is float:
                kinds.append(int)  # JSON writes 1.0 as 1
            if base is not type(None):
                kinds.append(base)
        out[f.name] = (tuple(kinds) or None, nested)
    return out


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


# ---------------------------------------------------------------------- replies


@dataclass
class LoadReply(Reply):
    """LOAD: a version built as the staged one."""

    op: ClassVar[WorkerOp] = WorkerOp.LOAD
    load_s: float
    #: Device memory it took (CUDA), or the worker's resident-set growth (CPU).
    footprint_bytes: int
    inputs: list[dict[str, Any]]
    input_form: str
    #: User modules dropped from sys.modules to be imported again.
    reimported: int = 0
    paused_s: float = 0.0
    #: Content digest of its weights, or None while it is hashed (`digest_pending`).
    digest: str | None = None
    digest_pending: bool = False
    #: Bytes the digest hashed (the rest were remembered); None while it is hashed.
    hashed_bytes: int | None = None
    #: Per push id: the digest leaves of its tensors, by pushed name (a worker mapping the
    #: push again hashes none of them: worker/shared_weights.py).
    overlay_leaves: dict[str, Any] | None = None
    #: Weight tensors shared with the serving version (same worker, unchanged files).
    reused: int = 0
    #: Weight tensors mapped from the serving worker's block (another worker).
    mapped: int = 0
    #: The block this worker read the files into (CPU, strategy respawn), to hand on.
    shared: dict[str, Any] | None = None
    #: Why the serving version's tensors could not be shared, when sharing was asked.
    not_reused: str | None = None
    #: Weights files read (with `reused`: the changed shards; the others were shared).
    read_files: int = 0
    #: Built as the serving module's copy, build() not called (a push: worker/push_copy.py).
    copied: bool = False
    #: Digest of what build() set each tensor the files replaced (worker/init_values.py).
    init_digests: dict[str, str] = field(default_factory=dict)
    #: Its peft adapters (worker/adapters.py `AdapterSet.wire`): the default, the base's
    #: digest, each adapter's digest and where its tensors came from. None: none declared.
    adapters: dict[str, Any] | None = None
    #: The project files this version imported (its code folders' modules; never
    #: site-packages or the standard library): the watcher reloads it when one changes.
    #: A failed LOAD's error reply carries the same field, with what it tried to import.
    imports: list[str] = field(default_factory=list)
    #: Installed modules (site-packages: transformers, peft, ...) imported since the worker
    #: started, in import order: a fresh standby imports them ahead of its first build.
    #: Empty for a build that imported nothing (a push): the serving version's stand.
    libraries: list[str] = field(default_factory=list)


@dataclass
class WarmReply(Reply):
    op: ClassVar[WorkerOp] = WorkerOp.WARM
    warm_s: float
    passes_ms: list[float] = field(default_factory=list)
    paused_s: float = 0.0
    #: The served signatures (WarmRequest.shapes) run, and those that failed (why).
    replayed: int = 0
    replay_failed: list[str] = field(default_factory=list)
    #: What torch.compile did during the warm phase (worker/compile_watch.py): compiles,
    #: seconds, cache hits and misses, recompile reasons; None for a model it never ran in.
    compile: dict[str, Any] | None = None


@dataclass
class SmokeReply(Reply):
    op: ClassVar[WorkerOp] = WorkerOp.SMOKE
    #: The output signature: name, dtype, shape of each output.
    outputs: list[dict[str, Any]]
    #: Things said once about the version (outputs left out of replies).
    notes: list[str] = field(default_factory=list)
    paused_s: float = 0.0
    #: LoadReply.imports once warm-up and smoke ran `forward` (a module it imports lazily).
    imports: list[str] = field(default_factory=list)
    #: The version's answers to the golden inputs (engine/golden.py has the form).
    golden: dict[str, Any] | None = None
    #: Their raw bytes: the frame's payload, never the header (no base64, no JSON). The
    #: engine's port puts a reply's payload here; the worker sends `golden_run.run`'s pieces.
    payload: Any = field(default=None, repr=False, compare=False)

    def wire(self) -> dict[str, Any]:
        """The header's fields: `payload` travels beside them, as bytes."""
        out = dataclasses.asdict(dataclasses.replace(self, payload=None))
        del out["payload"]
        return out


@dataclass
class SyncReply(Reply):
    """SYNC, and the `sync` part of an in-band SWAP: what the poll of the streams found."""

    op: ClassVar[WorkerOp] = WorkerOp.SYNC
    idle: bool = True
    busy: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    #: Nothing to wait for (the CPU, no CUDA streams), and why.
    skipped: bool = False
    reason: str | None = None


@dataclass
class SwapReply(Reply):
    op: ClassVar[WorkerOp] = WorkerOp.SWAP
    #: The version now serving.
    version: int
    #: An in-band swap's poll of the old version's streams (None: not in-band).
    sync: SyncReply | None = None


@dataclass
class FreedReply(Reply):
    """RELEASE and RETIRE: the device memory the dropped versions gave back (0 on the
    CPU, whose figure the reply does not wait for)."""

    op: ClassVar[WorkerOp] = WorkerOp.RELEASE
    freed_bytes: int = 0


@dataclass
class RestoreReply(Reply):
    op: ClassVar[WorkerOp] = WorkerOp.RESTORE
    #: The offloaded version, serving again.
    version: int


@dataclass
class StatusReply(Reply):
    """The worker's own figures: memory, allocator, versions, threads and streams."""

    op: ClassVar[WorkerOp] = WorkerOp.STATUS
    state: str
    pid: int
    device: str
    rss_bytes: int
    served: int = 0
    failed: int = 0
    skipped: int = 0
    #: Text requests stopped by a CANCEL (a client gone, a deadline passed, a reload past
    #: its drain).
    cancelled: int = 0
    version: int | None = None
    #: The serving version's description (its weights, code and adapters).
    current: dict[str, Any] | None = None
    staged: int | None = None
    #: Read while the loader thread warms it up: the manager's progress and deadline lines.
    staged_warm_passes_ms: list[float] | None = None
    #: How long the request running now has run (None: none is).
    busy_for_s: float | None = None
    torch: str | None = None
    threads: dict[str, int] | None = None
    streams: list[str] = field(default_factory=list)
    #: CUDA: the device's free and total bytes, and the caching allocator's figures.
    device_memory: dict[str, int] | None = None
    allocator: dict[str, int] | None = None
    #: Requests whose forward made torch.compile compile (on the serving path).
    serving_compiles: int = 0


@dataclass
class DigestReply(Reply):
    """The serving version's weights digest, once its background hashing is done."""

    op: ClassVar[WorkerOp] = WorkerOp.DIGEST
    #: None: no version serves.
    digest: str | None = None
    hashed_bytes: int | None = None
    #: Its adapters' digests, the base's included now (worker/adapters.py).
    adapters: dict[str, Any] | None = None
    #: The leaves of the weights block it read the files into, and of its pushes: the
    #: session hands them to the next worker that maps them (worker/shared_weights.py).
    block_leaves: dict[str, Any] | None = None
    overlay_leaves: dict[str, Any] | None = None


@dataclass
class Done(Reply):
    """The answer of an op that reports nothing but that it was done (OFFLOAD, PING,
    SHUTDOWN): a reply of no fields, so it never fails to read."""

    op: ClassVar[WorkerOp] = WorkerOp.PING


# ---------------------------------------------------------------------- requests


@dataclass
class LoadRequest(Request[LoadReply]):
    """Build `version` as the staged one: import the code, read the weights, lay the pushes
    over them (engine/model/pushes.py `WeightsPlan` says which)."""

    op: ClassVar[WorkerOp] = WorkerOp.LOAD
    reply: ClassVar[type[Reply]] = LoadReply
    version: int
    #: Drop the user's modules and import them again (False: a weights-only build, which
    #: still re-imports when the loaded code is not the code on disk).
    reimport: bool = True
    #: Other code paths (the last good snapshot, or the live files again).
    code: dict[str, Any] | None = None
    #: Share the serving version's tensors (same worker, unchanged files).
    reuse: bool = False
    overlays: list[dict[str, Any]] = field(default_factory=list)
    #: The serving worker's weights block, for a new worker to map.
    base: dict[str, Any] | None = None
    #: Indices of the weights files unchanged since the serving version read them.
    unchanged_files: list[int] | None = None
    #: A restart: an adapter whose files cannot be read is left out, not the model.
    restart: bool = False
    #: Another worker serves requests meanwhile: the build paces itself (build_pace).
    serving_elsewhere: bool = False


@dataclass
class WarmRequest(Request[WarmReply]):
    op: ClassVar[WorkerOp] = WorkerOp.WARM
    reply: ClassVar[type[Reply]] = WarmReply
    #: "staged" (a build's warm phase) or "current" (`hotreload rewarm`).
    target: str = "staged"
    #: Passes (None: the model's warmup_iters).
    iters: int | None = None
    serving_elsewhere: bool = False
    #: Input signatures the model served lately (engine/served_shapes.py), each a list of
    #: {name, dtype, shape}: run once each after the example, so no request pays a compile.
    shapes: list[Any] = field(default_factory=list)
    #: Seconds the warm phase may run before the rest of `shapes` is left out (a replay
    #: never fails a build by its deadline); None: no limit.
    replay_budget_s: float | None = None


@dataclass
class SmokeRequest(Request[SmokeReply]):
    op: ClassVar[WorkerOp] = WorkerOp.SMOKE
    reply: ClassVar[type[Reply]] = SmokeReply
    target: str = "staged"
    #: The serving version's outputs, when it serves in another worker.
    previous_outputs: list[dict[str, Any]] | None = None
    serving_elsewhere: bool = False


@dataclass
class SwapRequest(Request[SwapReply]):
    op: ClassVar[WorkerOp] = WorkerOp.SWAP
    reply: ClassVar[type[Reply]] = SwapReply
    #: On the serving thread, behind the requests already sent (their drain), then a poll
    #: of the old version's streams to `sync_deadline_s`.
    inband: bool = False
    sync_deadline_s: float = 5.0


@dataclass
class ReleaseRequest(Request[FreedReply]):
    op: ClassVar[WorkerOp] = WorkerOp.RELEASE
    reply: ClassVar[type[Reply]] = FreedReply
    #: "retired", "staged" or "current".
    which: str = "retired"


@dataclass
class OffloadRequest(Request[Done]):
    op: ClassVar[WorkerOp] = WorkerOp.OFFLOAD
    reply: ClassVar[type[Reply]] = Done


@dataclass
class RetireRequest(Request[FreedReply]):
    op: ClassVar[WorkerOp] = WorkerOp.RETIRE
    reply: ClassVar[type[Reply]] = FreedReply


@dataclass
class RestoreRequest(Request[RestoreReply]):
    op: ClassVar[WorkerOp] = WorkerOp.RESTORE
    reply: ClassVar[type[Reply]] = RestoreReply


@dataclass
class SyncRequest(Request[SyncReply]):
    op: ClassVar[WorkerOp] = WorkerOp.SYNC
    reply: ClassVar[type[Reply]] = SyncReply
    #: "current" or "retired".
    which: str = "current"
    deadline_s: float = 5.0


@dataclass
class StatusRequest(Request[StatusReply]):
    op: ClassVar[WorkerOp] = WorkerOp.STATUS
    reply: ClassVar[type[Reply]] = StatusReply
    #: A settled figure for leak checks: collect garbage, empty the allocator's cache.
    collect: bool = False


@dataclass
class DigestRequest(Request[DigestReply]):
    op: ClassVar[WorkerOp] = WorkerOp.DIGEST
    reply: ClassVar[type[Reply]] = DigestReply


@dataclass
class SaveReply(Reply):
    """What `hotreload save` wrote (worker/save_weights.py)."""

    op: ClassVar[WorkerOp] = WorkerOp.SAVE
    #: The files written, in the folder asked for.
    files: list[str] = field(default_factory=list)
    tensors: int = 0
    bytes: int = 0
    #: Written by the model's own `save_pretrained` (a Hugging Face model).
    pretrained: bool = False


@dataclass
class SaveRequest(Request[SaveReply]):
    """Write the serving version's weights into `folder` (absolute): safetensors under the
    model's own names, or its `save_pretrained` folder; `digest` and `model` go with them."""

    op: ClassVar[WorkerOp] = WorkerOp.SAVE
    reply: ClassVar[type[Reply]] = SaveReply
    folder: str
    model: str = ""
    digest: str | None = None


@dataclass
class EvalReply(Reply):
    """The serving version's eval figures (worker/eval_run.py)."""

    op: ClassVar[WorkerOp] = WorkerOp.EVAL
    version: int
    figures: dict[str, float] = field(default_factory=dict)
    eval_s: float = 0.0


@dataclass
class EvalRequest(Request[EvalReply]):
    """Score the serving version `version` with the config's `eval` (refused when another
    version serves by then: its own eval follows)."""

    op: ClassVar[WorkerOp] = WorkerOp.EVAL
    reply: ClassVar[type[Reply]] = EvalReply
    version: int


@dataclass
class PingRequest(Request[Done]):
    op: ClassVar[WorkerOp] = WorkerOp.PING
    reply: ClassVar[type[Reply]] = Done


@dataclass
class CancelRequest(Request[Done]):
    """Stop the `text` request `target` (the id it was sent with; streamed or not) at its
    next token; it then answers `{"ok": false, "error": {"code": "cancelled"}}`. Answered at
    once, whether or not that request still runs (one that ended already is left alone)."""

    op: ClassVar[WorkerOp] = WorkerOp.CANCEL
    reply: ClassVar[type[Reply]] = Done
    target: int


@dataclass
class ShutdownRequest(Request[Done]):
    op: ClassVar[WorkerOp] = WorkerOp.SHUTDOWN
    reply: ClassVar[type[Reply]] = Done


#: Every control op: its request class (whose `reply` is its answer's).
OPS: dict[WorkerOp, type[Request[Any]]] = {
    r.op: r
    for r in (
        LoadRequest,
        WarmRequest,
        SmokeRequest,
        SwapRequest,
        ReleaseRequest,
        OffloadRequest,
        RetireRequest,
        RestoreRequest,
        SyncRequest,
        StatusRequest,
        DigestRequest,
        SaveRequest,
        EvalRequest,
        PingRequest,
        CancelRequest,
        ShutdownRequest,
    )
}
#: The request path's ops: plain headers with tensors or text, answered by callback.
REQUEST_PATH_OPS = frozenset({WorkerOp.INFER, WorkerOp.TEXT})
#: Set (true) in a request-path reply that more replies to the same id follow: a streamed
#: `text` request's tokens, each with its version and digest, before the final reply.
PARTIAL = "partial"
#: The error code of a streamed request stopped by a CANCEL.
CANCELLED = "cancelled"
#: How a load refused for the model's `shapes` declaration begins: the fix is in the
#: config, not in the example callable (`hotreload check` says so).
SHAPES_REFUSED = "`shapes` in the config does not fit the example"

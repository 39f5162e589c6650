"""Every event kind the engine emits: one frozen dataclass each, and `EVENT_TYPES`.

`EventBus.emit("ready", model=..., ...)` (or `emit(Ready(model=..., ...))`) builds the
dataclass registered for the kind (engine/events.py `build`), so a kind nobody declared, a
field the kind does not declare, or a required field left out raises TypeError at the call,
naming kind and field: a typo fails a test instead of printing nothing. Subscribers receive
the dataclass itself and match on its class; every event carries `ts`, when it was made.
`events.as_dict` is the one serialisation, for the edges only (an events.jsonl line, the
socket's `events` stream): `{"ts", "kind", fields...}` in declaration order. An optional
field (default None) that is None is left out, a required one is always there.
`events.from_dict` gives the dataclass back (the remote dashboard, `hotreload report`).

Adding a kind:
  1. Write a class below, in the group it belongs to, decorated `@event("the_kind")` (a
     frozen, keyword-only dataclass; the kind must be new: a second one fails at import),
     subclassing `ModelEvent` when it is about one model (it gets `model: str`), else
     `BaseEvent`. Fields hold JSON values (str, int, float, bool, lists and dicts of them);
     one that may be None is typed `X | None = None`. `kind` is not a field name, nor `ts`
     (every event has it, from BaseEvent).
  2. Emit it: `events.emit("the_kind", model=..., ...)` or `events.emit(TheKind(...))`.
  3. Plain mode: give it a formatter in commands/printer.py's `FORMATTERS`, or list it in
     `SILENT_KINDS` there (tests/test_printer.py fails until it is one or the other). The
     dashboard (tui/app.py, tui/state.py) and /metrics (http/metrics.py) match on the
     classes too: see whether they should show it.
  tests/test_event_kinds.py reads every `emit("kind", ...)`, `emit(Kind(...))` and
  `set_state(...)` in hotreload/ and checks kind and keywords against this registry (a call
  site and its dataclass cannot drift apart), and fails for a kind nothing makes.

Engine code that imports only the standard library (no torch, textual, pynvml or front end).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, dataclass_transform

#: kind -> its dataclass (filled by `@event`).
EVENT_TYPES: dict[str, type[BaseEvent]] = {}
#: Keys of an event dict that are not fields of its kind.
RESERVED = frozenset({"ts", "kind"})

E = TypeVar("E", bound="BaseEvent")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseEvent:
    """An event. Its class says `kind`, its field names in order and the required ones."""

    kind: ClassVar[str]
    field_names: ClassVar[tuple[str, ...]] = ()
    required_fields: ClassVar[frozenset[str]] = frozenset()
    #: When it happened (epoch seconds): when it was made, as the engine emits an event as
    #: it makes it; a reader of events.jsonl or of the socket passes the line's own. Not a
    #: field of the kind (`field_names`), and no part of equality: two events that say the
    #: same thing are equal whenever they were said.
    ts: float = dataclasses.field(default_factory=time.time, compare=False, repr=False)


@dataclass_transform(frozen_default=True, kw_only_default=True)
def event(kind: str) -> Callable[[type[E]], type[E]]:
    """Make the class a frozen keyword-only dataclass for `kind`, and register it."""

    def register(cls: type[E]) -> type[E]:
        if not kind or kind in EVENT_TYPES:
            raise TypeError(f"event kind {kind!r} is empty or declared twice ({cls.__name__})")
        made = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        # BaseEvent's `ts` (the very field object, inherited) is every event's, no kind's.
        fields = [f for f in dataclasses.fields(made) if f is not _TS]
        bad = {f.name for f in fields} & {*RESERVED, "field_names", "required_fields"}
        if bad:
            raise TypeError(f"event {kind!r}: {sorted(bad)} cannot be field names")
        made.kind = kind
        made.field_names = tuple(f.name for f in fields)
        made.required_fields = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        EVENT_TYPES[kind] = made
        return made

    return register


_TS = BaseEvent.__dataclass_fields__["ts"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelEvent(BaseEvent):
    """An event about one model."""

    model: str


# ------------------------------------------------------------------ session and config


@event("session_started")
class SessionStarted(BaseEvent):
    socket: str
    pid: int
    models: list[str]


@event("session_stopping")
class SessionStopping(BaseEvent):
    pass


@event("session_stopped")
class SessionStopped(BaseEvent):
    pass


@event("session_lost")
class SessionLost(BaseEvent):
    """The socket to the session closed: published by the attached dashboard
    (tui/remote.py), never by the engine."""


@event("cpus")
class Cpus(BaseEvent):
    """Where the models serve (engine/cpus.py)."""

    #: model -> its CPUs.
    serving: dict[str, list[int]]
    rest: list[int]
    detail: str


@event("config_error")
class ConfigError(BaseEvent):
    error: str


@event("config_changed")
class ConfigChanged(BaseEvent):
    detail: str


@event("http_started")
class HttpStarted(BaseEvent):
    url: str
    host: str
    port: int
    metrics_url: str


@event("events_file_error")
class EventsFileError(BaseEvent):
    """events.jsonl cannot be written (to subscribers only: the file cannot take it)."""

    message: str


@event("events_file_resumed")
class EventsFileResumed(BaseEvent):
    #: Lines dropped while the file could not be written.
    lost: int
    message: str


# ------------------------------------------------------------------ a model's worker


@event("state")
class State(ModelEvent):
    """`ModelHost.set_state`: the state, and whatever that state change is told with."""

    state: str
    version: int | None = None
    pid: int | None = None
    error: str | None = None
    reason: str | None = None
    phase: str | None = None
    #: How long the forward that wedged the worker had run.
    forward_s: float | None = None


@event("worker_started")
class WorkerStarted(ModelEvent):
    pid: int | None = None
    device: str | None = None


@event("ready")
class Ready(ModelEvent):
    version: int
    device: str | None = None
    pid: int | None = None
    load_s: float
    warm_s: float
    #: Inputs that vary beyond the batch (`describe_dynamic`), or None.
    inputs: str | None = None
    #: The content digest of the weights it serves (None: not a torch module).
    digest: str | None = None


@event("start_failed")
class StartFailed(ModelEvent):
    phase: str | None = None
    error: str
    traceback: str | None = None


@event("model_note")
class ModelNote(ModelEvent):
    message: str


@event("cpus_failed")
class CpusFailed(ModelEvent):
    pid: int | None = None
    detail: str


@event("worker_died")
class WorkerDied(ModelEvent):
    pid: int | None = None
    reason: str | None = None


@event("worker_restarted")
class WorkerRestarted(ModelEvent):
    pid: int | None = None
    version: int
    reason: str


@event("restart_failed")
class RestartFailed(ModelEvent):
    attempt: int
    phase: str
    error: str


@event("wedged")
class Wedged(ModelEvent):
    """A forward or a reload phase past its deadline: the worker is killed."""

    phase: str
    detail: str


@event("worker_lost")
class WorkerLost(ModelEvent):
    """The old worker failed or died in drain or sync after a respawn's swap (abandoned)."""

    phase: str
    detail: str


@event("snapshot_rewritten")
class SnapshotRewritten(ModelEvent):
    files: list[str]
    message: str


@event("standby_ready")
class StandbyReady(ModelEvent):
    pid: int | None = None
    #: How many times this process was kept as a standby (0: a fresh one).
    recycled: int
    #: What a recycled one was kept after ("serving", a failed build).
    after: str | None = None


@event("standby_failed")
class StandbyFailed(ModelEvent):
    error: str


@event("recycle_disabled")
class RecycleDisabled(ModelEvent):
    reason: str


@event("rewarm_started")
class RewarmStarted(ModelEvent):
    pass


@event("rewarm_done")
class RewarmDone(ModelEvent):
    warm_s: float
    passes_ms: list[float]


@event("gpu_reset")
class GpuReset(ModelEvent):
    """A GPU reset after a wedge: done, refused, or waiting for a confirmation (ok False)."""

    ok: bool
    message: str


# ------------------------------------------------------------------ reloads


@event("reload_requested")
class ReloadRequested(ModelEvent):
    trigger: str
    #: The changed files, comma separated, or None.
    detail: str | None = None
    #: Behind a reload running now (it runs as the follow-up).
    queued: bool


@event("policy")
class Policy(ModelEvent):
    policy: str
    reason: str


@event("phase_start")
class PhaseStart(ModelEvent):
    phase: str


@event("phase_end")
class PhaseEnd(ModelEvent):
    phase: str
    duration_s: float
    ok: bool
    skipped: bool | None = None
    detail: str | None = None


@event("reload_done")
class ReloadDone(ModelEvent):
    version: int
    total_s: float
    policy: str
    strategy: str
    #: Seconds per phase, in the order they ran.
    phases: dict[str, float]
    trigger: str
    # None on a reload that worked: the reloader emits both outcomes from one call.
    phase: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: The content digest of the weights now serving.
    digest: str | None = None
    #: What requests must send changed: `input [N,3,32,32] → [N,3,64,64]` (None: nothing).
    inputs_changed: str | None = None
    #: Nothing was built: the code and weights were the serving version's (this line says
    #: so: "unchanged: nothing to reload ..."; engine/model/unchanged.py).
    unchanged: str | None = None
    #: torch.compile in the new version's warm phase: compiles, seconds, cache hits and
    #: misses, recompile reasons (worker/compile_watch.py; None: an eager model).
    compile: dict[str, Any] | None = None
    #: How the new version's golden outputs differ from the old one's (engine/golden.py
    #: `compare`: `identical`, per output `max_abs`, ...; None: nothing compared).
    golden: dict[str, Any] | None = None
    #: A rollback (trigger "rollback"): the kept version it served again.
    rollback_of: int | None = None


@event("reload_failed")
class ReloadFailed(ModelEvent):
    """A reload that failed; the version it names keeps serving. `total_s`, `policy`,
    `strategy` and `phases` are missing when the reload itself crashed (a bug of ours)."""

    version: int
    total_s: float | None = None
    policy: str | None = None
    strategy: str | None = None
    phases: dict[str, float] | None = None
    trigger: str
    #: The phase that failed.
    phase: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: The content digest of the weights that serve on.
    digest: str | None = None


@event("eval_done")
class EvalDone(ModelEvent):
    """A version's eval (config `eval`; engine/model/evals.py): its figures, or why there are
    none (it raised, returned something else, or ran past `eval_timeout_s`). Either way the
    version serves on."""

    version: int
    figures: dict[str, float] | None = None
    eval_s: float | None = None
    error: str | None = None


@event("weights_override")
class WeightsOverride(ModelEvent):
    version: int
    message: str


@event("checkpoint_wait")
class CheckpointWait(ModelEvent):
    """A reload waits for a weights file still being written (engine/checkpoint_ready.py)."""

    file: str
    message: str


@event("lock_wait")
class LockWait(ModelEvent):
    """A reload has waited over a second for its device's lock (engine/locks.py)."""

    device: str
    #: Who holds it: "waiting for the cuda:0 reload lock, held by pid 12, model 'a', config …".
    message: str


@event("restore_failed")
class RestoreFailed(ModelEvent):
    error: str


@event("snapshot_skipped")
class SnapshotSkipped(ModelEvent):
    reason: str


# ------------------------------------------------------------------ the watcher


@event("watching")
class Watching(BaseEvent):
    paths: list[str]
    files: int
    quiet_ms: int
    max_wait_ms: int
    #: "inotify" or "polling".
    mode: str


@event("watch_error")
class WatchError(BaseEvent):
    error: str


@event("change_detected")
class ChangeDetected(BaseEvent):
    """The first change of a debounce window."""

    path: str


@event("file_unused")
class FileUnused(BaseEvent):
    """A saved file that no model imports or declares (said once per file)."""

    path: str


@event("watch_paused")
class WatchPaused(BaseEvent):
    pass


@event("watch_waiting")
class WatchWaiting(BaseEvent):
    #: Files changed while paused (reloaded on resume).
    waiting: int


@event("watch_resumed")
class WatchResumed(BaseEvent):
    waiting: int


# ------------------------------------------------------------------ the GPU


@event("xid")
class Xid(BaseEvent):
    """One Xid report: the keys of `gpu.xid_events.event_to_json`."""

    xid: int
    pci: str | None = None
    #: "dddd:bb:dd", or None.
    bus: str | None = None
    #: The NVML device index.
    device: int | None = None
    pid: int | None = None
    process: str | None = None
    name: str
    severity: str
    action: str
    text: str
    timestamp: str | None = None
    received_at: float
    source: str
    phase: str | None = None
    known: bool
    mnemonic: str | None = None
    inferred: bool
    also_from: list[str]


@event("xid_sources")
class XidSources(BaseEvent):
    #: {"name", "active", "reason"} per source.
    sources: list[dict[str, Any]]


@event("gpu_unavailable")
class GpuUnavailable(BaseEvent):
    reason: str | None = None

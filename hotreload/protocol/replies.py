"""The worker's replies to the build ops, one dataclass each, shared by both ends.

The worker (worker/server.py) builds them and sends `reply.wire()`; the engine's phases
(engine/model/phases.py) read them back with `Reply.from_wire(header)`, which fails loudly,
naming the op and the field, when a required field is missing or has the wrong type, so a
reply that changed shape on one side cannot be read with silent defaults on the other. The
scripted fake worker of the tests builds the same classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from hotreload.errors import ProtocolError

R = TypeVar("R", bound="Reply")

#: Keys every reply header has that are not the op's fields.
_ENVELOPE = frozenset({"id", "ok"})


@dataclass
class Reply:
    """Base of the typed replies: `wire()` and `from_wire()` in one place."""

    op: ClassVar[str] = ""

    def wire(self) -> dict[str, Any]:
        """The reply's fields as the header carries them (the worker adds `id` and `ok`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls: type[R], header: dict[str, Any]) -> R:
        """The reply in `header`; ProtocolError names a required field that is missing or
        not of its type. Fields the class does not declare are ignored (a newer worker)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in header and header[f.name] is not None:
                values[f.name] = header[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{cls.op} reply without its field {f.name!r}: {header!r}")
        for name, kind in _TYPES.get(cls.__name__, {}).items():
            value = values.get(name)
            if value is not None and not isinstance(value, kind):
                raise ProtocolError(
                    f"{cls.op} reply field {name!r} is {type(value).__name__}, not {kind}"
                )
        return cls(**values)


@dataclass
class LoadReply(Reply):
    """LOAD: a version built as the staged one."""

    op: ClassVar[str] = "load"
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
    op: ClassVar[str] = "warm"
    warm_s: float
    passes_ms: list[float] = field(default_factory=list)
    paused_s: float = 0.0


@dataclass
class SmokeReply(Reply):
    op: ClassVar[str] = "smoke"
    #: The output signature: name, dtype, shape of each output.
    outputs: list[dict[str, Any]]
    #: Things said once about the version (outputs left out of replies).
    notes: list[str] = field(default_factory=list)
    paused_s: float = 0.0
    #: LoadReply.imports once warm-up and smoke ran `forward` (a module it imports lazily).
    imports: list[str] = field(default_factory=list)


@dataclass
class SyncReply(Reply):
    """SYNC, and the `sync` part of an in-band SWAP: what the poll of the streams found."""

    op: ClassVar[str] = "sync"
    idle: bool = True
    busy: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    #: Nothing to wait for (the CPU, no CUDA streams), and why.
    skipped: bool = False
    reason: str | None = None


#: Types checked on the way in (JSON numbers may be ints where floats are declared).
_TYPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "LoadReply": {
        "load_s": (int, float),
        "footprint_bytes": int,
        "inputs": list,
        "input_form": str,
        "reimported": int,
        "reused": int,
        "mapped": int,
        "init_digests": dict,
        "imports": list,
        "hashed_bytes": int,
        "overlay_leaves": dict,
        "copied": bool,
    },
    "WarmReply": {"warm_s": (int, float), "passes_ms": list},
    "SmokeReply": {"outputs": list, "notes": list, "imports": list},
    "SyncReply": {"busy": list, "streams": list, "waited_s": (int, float)},
}

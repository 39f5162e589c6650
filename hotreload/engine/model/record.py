"""The state of one served model, as one plain record.

Only the model's supervisor (supervisor.py) writes it; everything else (status, the
dashboard, HTTP, the telemetry sampler) reads it. Every change to which worker serves, or
which version, therefore happens inside one of the supervisor's jobs, one at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotreload.engine.model.jobs import ReloadOutcome
    from hotreload.engine.model.kept_versions import KeptVersion
    from hotreload.engine.model.pushes import Overlay, WeightsBlock
    from hotreload.engine.snapshots import Snapshot
    from hotreload.engine.worker_port import Worker

#: States shown to users (status, dashboard, metrics).
STATES = (
    "starting",
    "loading",
    "warming",
    "serving",
    "reloading",
    "draining",
    "restarting",
    "failed",
    "wedged",
    "stopped",
    "unloaded",
)


@dataclass
class VersionInfo:
    """What is known about the version a worker serves."""

    version: int
    load_s: float = 0.0
    warm_s: float = 0.0
    warm_passes_ms: list[float] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    input_form: str = "single"
    footprint_bytes: int = 0
    #: What build() set each tensor the weights files replaced, digested (override_check).
    init_digests: dict[str, str] = field(default_factory=dict)
    #: Content digest of its weights (worker/weights_digest.py): equal weights, equal
    #: digest, whether they came from a file or a push. None: not a torch module.
    digest: str | None = None
    #: The worker is still hashing its weights (phases.settle_digest asks for the digest).
    digest_pending: bool = False
    #: The weights files as this version found them, and the pushes it holds.
    weights_stat: tuple[Any, ...] | None = None
    overlays: list[Overlay] = field(default_factory=list)
    #: The block of shared memory its file weights live in (CPU; pushes.WeightsBlock).
    block: WeightsBlock | None = None
    #: What its build said once (outputs left out of replies, pushes it could not read).
    notes: list[str] = field(default_factory=list)
    #: Its peft adapters: default, base digest, each adapter's digest (LoadReply.adapters).
    adapters: dict[str, Any] | None = None
    #: The project files its code imported, as the worker found them (LoadReply.imports).
    imports: tuple[str, ...] = ()
    #: Installed modules its build imported (a fresh standby imports them ahead of time).
    libraries: tuple[str, ...] = ()
    #: What torch.compile did in its warm phase (WarmReply.compile; None: eager).
    compile: dict[str, Any] | None = None
    #: Its answers to the golden inputs (engine/golden.py GoldenSet; None: not run).
    golden: Any = None
    #: How they differ from the version it replaced (golden.compare; None: nothing to
    #: compare with, a first version or a restart).
    golden_diff: dict[str, Any] | None = None
    #: Its eval (engine/model/evals.py): {"version", "figures", "eval_s"} or {"version",
    #: "error"}; None: no eval configured, or not run yet.
    eval: dict[str, Any] | None = None


@dataclass
class ModelRecord:
    """Which workers a model has, what they serve, and what happened to them."""

    #: The worker answering requests (None: unloaded, or never started).
    serving: Worker | None = None
    #: strategy "respawn": the worker started ahead of time for the next reload.
    standby: Worker | None = None
    #: strategy "respawn": the worker a reload just replaced, while it drains and syncs.
    retiring: Worker | None = None
    #: The version `serving` serves.
    current: VersionInfo | None = None
    #: The highest version this session served: a load after an unload goes on from it, so
    #: a version number never names two different builds within a session.
    last_version: int = 0
    restarts: int = 0
    state: str = "stopped"
    last_error: str | None = None
    #: The phase runner of the job running now (phases.PhaseClock).
    clock: Any = None
    #: Copy of the code and weights of the version serving now (None: use the disk).
    good_snapshot: Snapshot | None = None
    #: The snapshot taken for the last start or reload: its build compiles the user's code
    #: from the copies there, the code on disk when it started (worker/fresh_source.py).
    build_snapshot: Snapshot | None = None
    #: The last good versions, oldest first, the serving one last (`keep_versions` of
    #: them): what `hotreload rollback` builds again (kept_versions.py).
    kept: list[KeptVersion] = field(default_factory=list)
    #: Every reload's outcome, oldest first.
    history: list[ReloadOutcome] = field(default_factory=list)
    #: Weights pushed since the weights files last changed, oldest first: every build lays
    #: them over the files' (pushes.py), so a restart serves the same weights.
    overlays: list[Overlay] = field(default_factory=list)
    #: The weights files as the serving version found them (inode, size, times): unchanged
    #: files let a build share the serving version's tensors instead of reading them.
    weights_stat: tuple[Any, ...] | None = None
    #: (stamp, sha256) of each weights file as the serving version read them (None: not
    #: hashed, a checkpoint past unchanged.MAX_COMPARE_BYTES), to tell a save of the same
    #: bytes (unchanged.py).
    weights_sha: tuple[tuple[Any, str | None], ...] | None = None
    #: Project files that builds which failed since the serving version tried to import
    #: (the watcher watches them too: saving the fix reloads). Cleared by a new version.
    tried_imports: tuple[str, ...] = ()
    #: Why this model's workers are no longer kept as standbys (respawn.py): its code
    #: fails a second import in one process. None: they are.
    recycle_off: str | None = None
    started_at: float = field(default_factory=time.time)

    @property
    def phase(self) -> str | None:
        """The phase of the job running now (events and Xid reports are tagged with it)."""
        return self.clock.phase if self.clock is not None else None

    @property
    def version(self) -> int:
        return self.current.version if self.current else 0

    @property
    def next_version(self) -> int:
        """The number the next build gets: one past the highest this session served."""
        return max(self.last_version, self.version) + 1

    def workers(self) -> list[Worker]:
        """Every process this model has now (the GPU process list marks them as ours)."""
        return [w for w in (self.serving, self.standby, self.retiring) if w is not None]


@dataclass(frozen=True)
class ModelView:
    """What front ends (HTTP, /metrics, `hotreload check`, the dashboard's ops) read of a
    model: a frozen snapshot the supervisor publishes (`ModelSupervisor.view`), never its
    record, router or versions themselves."""

    name: str
    state: str
    #: The version serving (0: none yet), its weights digest, and its figures.
    version: int
    digest: str | None
    device: str | None
    pid: int | None
    restarts: int
    last_error: str | None
    #: The phase of the job running now (None: no job).
    phase: str | None
    #: Whether a version has finished warm-up (`version` serves, or served before a reload).
    has_version: bool
    load_s: float
    warm_s: float
    warm_passes_ms: tuple[float, ...]
    outputs: tuple[dict[str, Any], ...]
    #: What requests are checked against (the serving version's inputs).
    inputs: tuple[dict[str, Any], ...]
    input_form: str
    #: The router's queue and request figures at the time of the snapshot.
    queue_depth: int
    queue_limit: int
    inflight: int
    requests: dict[str, int]
    #: A generator's text figures (engine/text_stats.py: tokens/s, time to first token).
    text: dict[str, Any]
    #: The serving version's peft adapters (VersionInfo.adapters; None: none declared).
    adapters: dict[str, Any] | None = None
    #: torch.compile in the serving version's warm phase (VersionInfo.compile).
    compile: dict[str, Any] | None = None

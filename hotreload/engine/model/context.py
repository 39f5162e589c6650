"""What the phases, strategies and recovery see of their supervisor: a protocol, so that
they depend on this module and not on supervisor.py (which imports them all), and so the
import graph of the package stays one-way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hotreload.config import Config, ModelConfig
    from hotreload.engine.events import EventBus
    from hotreload.engine.ignore import IgnoreRules
    from hotreload.engine.model.jobs import Job, ReloadJob, ReloadOutcome
    from hotreload.engine.model.record import ModelRecord, VersionInfo
    from hotreload.engine.model.workers import WorkerFactory
    from hotreload.engine.router import ModelRouter
    from hotreload.engine.snapshots import Snapshot
    from hotreload.engine.worker_proc import WorkerProcess


class Runner(Protocol):
    """Runs a job's phases (phases.PhaseRunner)."""

    outcome: ReloadOutcome | None

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        deadline_s: float | None = None,
        state: str | None = None,
    ) -> Any: ...


class Strategy(Protocol):
    """How a reload builds the next version: in the serving worker, or in another one."""

    name: str

    async def reload(self, runner: Runner, job: ReloadJob, policy: str) -> None: ...

    async def new_worker(
        self, runner: Runner, job: ReloadJob, version: int
    ) -> tuple[WorkerProcess, VersionInfo]: ...

    async def after_job(self) -> None: ...

    async def close(self) -> None: ...


class Supervisor(Protocol):
    """A model's supervisor (supervisor.py), as its parts use it."""

    model: ModelConfig
    config: Config
    events: EventBus
    router: ModelRouter
    record: ModelRecord
    workers: WorkerFactory
    strategy: Strategy
    #: Builds pushes in the serving worker, whatever the strategy.
    inplace: Strategy
    ignore: IgnoreRules
    snapshot_dir: Path | None
    override_warned: bool
    escalate: Callable[[Any], Awaitable[None]] | None

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def current(self) -> VersionInfo | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def busy(self) -> bool: ...

    def submit(self, job: Job) -> Job: ...
    def not_run(self, trigger: str, detail: list[str], why: str) -> ReloadOutcome: ...
    def device_lock(
        self, outcome: ReloadOutcome | None = None
    ) -> AbstractAsyncContextManager[None]: ...
    def ensure_watchdog(self) -> None: ...
    async def worker_status(
        self, timeout_s: float = 1.0, max_age_s: float = 0.0
    ) -> dict[str, Any]: ...

    # The state changes: the only writes to `record`.
    def set_state(self, state: str, **fields: Any) -> None: ...
    def enter_phase(self, name: str | None) -> None: ...
    def note_error(self, error: str | None) -> None: ...
    def count_restart(self) -> None: ...
    def note_digest(self, info: VersionInfo, digest: str | None) -> None: ...
    def add_history(self, outcome: ReloadOutcome) -> None: ...
    def set_good_snapshot(self, snapshot: Snapshot | None) -> Snapshot | None: ...
    def install(
        self,
        worker: WorkerProcess,
        info: VersionInfo,
        *,
        announce: bool = True,
        handover: bool = False,
        open_gate: bool = True,
    ) -> None: ...
    def keep_standby(
        self, worker: WorkerProcess, *, recycled: int = 0, after: str | None = None
    ) -> None: ...
    def take_standby(self) -> WorkerProcess | None: ...
    def mark_retiring(self, worker: WorkerProcess | None) -> None: ...
    async def spawn(
        self, code: dict[str, Any] | None, *, standby: bool = False, phase: str = "spawn"
    ) -> WorkerProcess: ...
    def adopt(self, worker: WorkerProcess) -> None: ...
    def note(self, notes: list[str] | None) -> None: ...
    def warn_weights_override(self, job: ReloadJob, info: VersionInfo) -> None: ...

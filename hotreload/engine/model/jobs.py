"""The jobs a model's supervisor runs one at a time, what a reload produces, and the errors
its phases raise.

Every change to a model's workers is one of these jobs (supervisor.py): starting it,
reloading it (a file edit, a key, `hotreload reload`), restarting a worker that died or
wedged, unloading it. They queue in order; two reloads asked for while one runs collapse
into a single follow-up, and a restart asked for twice for the same worker runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from hotreload.engine.model.pushes import Overlay
    from hotreload.engine.worker_port import Worker

T = TypeVar("T")


@dataclass
class ReloadOutcome:
    """What happened to one reload (also the reply to `hotreload reload` and HTTP load)."""

    model: str
    ok: bool
    #: The version serving after the reload (the old one when it failed).
    version: int
    trigger: str
    policy: str = ""
    strategy: str = ""
    #: The phase that failed, or None.
    phase: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: Seconds per phase, in the order they ran.
    phases: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    detail: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    #: Nothing was built: code and weights were the serving version's (unchanged.py).
    unchanged: bool = False
    #: The serving weights' digest after it, and its peft adapters' (default, base and
    #: per-adapter digests; None: no adapters declared).
    digest: str | None = None
    adapters: dict[str, Any] | None = None
    #: The version's eval, once it ran after the outcome (engine/model/evals.py): figures,
    #: seconds, or the error. None: no eval configured, or not run yet.
    eval: dict[str, Any] | None = None
    #: A rollback: the kept version it serves again (engine/model/rollback.py).
    rollback_of: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def internal_error(cls, model: str, version: int, job: Job, exc: Exception) -> ReloadOutcome:
        """A bug of ours in `job`, not the user's: said with its traceback; reloads go on."""
        why = f"internal error during the reload: {exc!r}"
        trigger = getattr(job, "trigger", job.kind)  # a reload's trigger; "push"
        out = cls(
            model, False, version, trigger, error=why, detail=list(getattr(job, "detail", []))
        )
        out.traceback = traceback.format_exc()
        return out


class PhaseFailed(Exception):
    """A phase of a start, reload or restart failed; `phase` names it. Raised to callers of
    `start` too (a model that could not come up)."""

    def __init__(self, phase: str, message: str, remote_traceback: str | None = None) -> None:
        self.phase = phase
        self.remote_traceback = remote_traceback
        #: A worker whose build failed in the user's code but is fit to build the next
        #: version: the strategy asks for it to be kept as the standby (respawn).
        self.standby: Worker | None = None
        self.recycled = 0
        super().__init__(message)


class Wedged(PhaseFailed):
    """Drain or sync past its deadline: the worker must be killed."""


@dataclass(frozen=True)
class Ran(Generic[T]):
    """What a phase found (its `phase_end` detail), and what it made for the job."""

    detail: str
    value: T = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Skipped:
    """A phase with nothing to do here, and why (on the CPU there are no CUDA streams)."""

    reason: str | None


@dataclass
class Job:
    """One unit of work on a model; `future` settles when it is done."""

    kind: ClassVar[str] = "job"
    future: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
            self.future.exception()  # a caller who stopped waiting must not log it
        else:
            self.future.set_result(result)


@dataclass
class StartJob(Job):
    kind: ClassVar[str] = "start"


@dataclass
class ReloadJob(Job):
    kind: ClassVar[str] = "reload"
    trigger: str = "command"
    detail: list[str] = field(default_factory=list)
    #: Only weights files changed: the code need not be imported again.
    weights_only: bool = False
    #: Build even when nothing changed (`hotreload reload --force`, the dashboard's key).
    force: bool = False
    #: The model's edited `[[models]]` section to reload with (settings_change.Settings).
    settings: Any = None

    def merge(
        self,
        trigger: str,
        detail: list[str],
        weights_only: bool,
        force: bool = False,
        settings: Any = None,
    ) -> None:
        self.force = self.force or force
        self.settings = settings or self.settings  # the newest edit of the section
        if trigger not in self.trigger.split("+"):
            self.trigger += "+" + trigger
        self.detail += [d for d in detail if d not in self.detail]
        # One code change among the edits means the code must be re-imported.
        self.weights_only = self.weights_only and weights_only


@dataclass
class RestartJob(Job):
    """Replace a worker that died or hung, on the last good version."""

    kind: ClassVar[str] = "restart"
    reason: str = "worker died"
    wedged: bool = False
    #: The worker to replace; the job does nothing once another one serves.
    worker: Worker | None = None


@dataclass
class PushJob(Job):
    """A trainer's weights as the next version (pushes.py): the serving code with these
    weights on top, built in the serving worker. Pushes never merge: each one is a version
    of its own, answered with its own digest."""

    kind: ClassVar[str] = "push"
    push: Overlay | None = None
    detail: list[str] = field(default_factory=list)
    #: The digest a push of changed tensors only goes on top of (None: a whole state).
    base_digest: str | None = None
    #: Set by the push path when that base no longer served: nothing was built.
    stale: str | None = None


@dataclass
class UnloadJob(Job):
    kind: ClassVar[str] = "unload"


class JobQueue:
    """Jobs waiting their turn, with the collapsing rules."""

    def __init__(self) -> None:
        self._jobs: deque[Job] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._jobs)

    def add(self, job: Job) -> Job:
        """Queue `job`, or return the queued job that already covers it. A reload never
        merges into one queued before a rollback (kind "rollback"): an edit saved after the
        rollback was asked for runs after it, else the rollback would undo it."""
        last_rollback = max(
            (i for i, q in enumerate(self._jobs) if q.kind == "rollback"), default=-1
        )
        for i, queued in enumerate(self._jobs):
            if (
                isinstance(job, ReloadJob)
                and i > last_rollback
                and isinstance(queued, ReloadJob)
                # A file reload never shares the fate of new settings (which may fail).
                and (job.settings is None) == (queued.settings is None)
            ):
                queued.merge(job.trigger, job.detail, job.weights_only, job.force, job.settings)
                return queued
            if (
                isinstance(job, RestartJob)
                and isinstance(queued, RestartJob)
                and queued.worker is job.worker
            ):
                queued.wedged = queued.wedged or job.wedged
                return queued
        self._jobs.append(job)
        self._ready.set()
        return job

    async def next(self) -> Job:
        while not self._jobs:
            self._ready.clear()
            await self._ready.wait()
        return self._jobs.popleft()

    def drain(self) -> list[Job]:
        jobs = list(self._jobs)
        self._jobs.clear()
        return jobs


class JobLoop:
    """Runs jobs one at a time, in order, on a task of its own: `run(job)` does each, and
    `after()` runs between jobs (the standby worker starts then, never beside a build)."""

    def __init__(
        self, name: str, run: Callable[[Job], Awaitable[None]], after: Callable[[], None]
    ) -> None:
        self.name, self._run, self._after = name, run, after
        self._queue = JobQueue()
        self._running: Job | None = None
        self._loop: asyncio.Task[None] | None = None
        self._job: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def busy(self) -> bool:
        """A job runs or waits."""
        return self._running is not None or len(self._queue) > 0

    def submit(self, job: Job) -> Job:
        """Queue `job` (or the queued job that covers it, jobs collapse: JobQueue)."""
        if self._loop is None:
            self._loop = asyncio.create_task(self._jobs(), name=f"jobs-{self.name}")
        return self._queue.add(job)

    async def _jobs(self) -> None:
        while not self.closed:
            job = await self._queue.next()
            self._running = job
            self._job = asyncio.create_task(self._run(job), name=f"{job.kind}-{self.name}")
            await asyncio.wait([self._job])
            self._running = self._job = None
            if not self.closed:
                self._after()

    async def close(self) -> list[Job]:
        """No job runs any more: the running one is cancelled (a build can take minutes);
        returns the queued ones, never run, for the caller to answer."""
        self.closed = True
        queued = self._queue.drain()
        for task in (self._job, self._loop):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        return queued

"""Where a supervisor gets its worker processes: the one seam its tests replace.

A real `WorkerFactory` starts `WorkerProcess`es; the stepped supervisor tests hand the
supervisor a `Spawner` of scripted fake workers that implement the same port
(engine/worker_port.py).
Placement on CPUs lives here too: it acts on processes, not on the model's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from hotreload.config import Config, ModelConfig
from hotreload.engine.cpus import pin_process
from hotreload.engine.event_kinds import CpusFailed, WorkerStarted
from hotreload.engine.events import EventBus
from hotreload.engine.model.jobs import PhaseFailed, Ran
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.engine.worker_proc import WorkerProcess

#: Niceness of a standby worker's start-up (imports): it takes spare CPU only.
STANDBY_NICE = 10
#: A standby's start deadline, in units of `deadlines.start_s`.
STANDBY_START_FACTOR = 10


class Spawner(Protocol):
    def __call__(
        self, generation: int, code: dict[str, Any] | None, *, standby: bool
    ) -> Worker: ...


class WorkerFactory:
    """Starts a model's worker processes and places them on its CPUs."""

    def __init__(
        self,
        model: ModelConfig,
        config: Config,
        events: EventBus,
        *,
        on_death: Callable[[Worker], None],
        make: Spawner | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.events = events
        #: Told when an adopted worker dies on its own (the supervisor queues a restart).
        self.on_death = on_death
        self._make = make or self._process
        #: The serving worker's own CPUs, and everything else's (None: not pinned). Set by
        #: the session from its CpuPlan before any worker starts.
        self.cpus: frozenset[int] | None = None
        self.cpus_rest: frozenset[int] = frozenset()
        self._pin_failed = False
        #: One per worker process started (a worker's name in its logs).
        self.generation = 0

    def _process(
        self, generation: int, code: dict[str, Any] | None, *, standby: bool
    ) -> WorkerProcess:
        worker = WorkerProcess(
            self.model,
            self.config,
            generation,
            code,
            boot_nice=STANDBY_NICE if standby else 0,
        )
        if self.cpus is not None:
            worker.build_cpus = self.cpus_rest
        return worker

    async def spawn(
        self,
        code: dict[str, Any] | None = None,
        *,
        standby: bool = False,
        phase: str = "spawn",
        preimport: tuple[str, ...] = (),
    ) -> Worker:
        """A started worker; PhaseFailed(`phase`) when it cannot start. Nothing is left
        behind on failure or cancellation. A `standby` starts at low priority and stays out
        of the death handling until a reload takes it (`adopt`); it imports `preimport`
        (the serving version's libraries) at that priority too, ahead of its first build."""
        self.generation += 1
        worker = self._make(self.generation, code, standby=standby)
        if standby and preimport:
            worker.preimport = tuple(preimport)
        # A standby imports at idle priority on cores busy serving: give it time.
        deadline = self.model.deadlines.start_s * (STANDBY_START_FACTOR if standby else 1)
        try:
            await worker.start(deadline)
        except (WorkerDied, WorkerReplyError, TimeoutError) as exc:
            await worker.end()
            raise PhaseFailed(phase, f"worker failed to start: {exc}") from exc
        except BaseException:
            await worker.end()  # cancelled (shutdown): never leave a process behind
            raise
        if not standby:
            self.adopt(worker)
            self.events.emit(
                WorkerStarted(model=self.model.name, pid=worker.pid, device=worker.device)
            )
        return worker

    def adopt(self, worker: Worker) -> None:
        """From now on its death is the model's business (restart, retries)."""
        worker.on_death = self.on_death

    @contextlib.asynccontextmanager
    async def owned(self, worker: Worker) -> AsyncIterator[Held]:
        """`worker`'s life for the block: killed when the block raises or is cancelled, or
        ends without `held.keep()` (it was neither installed nor kept as the standby).
        The one place a worker a job started is stopped on the way out."""
        held = Held(worker)
        try:
            yield held
        finally:
            if not held.kept:
                await worker.end()

    @contextlib.asynccontextmanager
    async def spawning(
        self,
        code: dict[str, Any] | None,
        *,
        phase: str = "spawn",
        run: Callable[..., Awaitable[Any]] | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[Held]:
        """A new worker, started as the phase `phase` (timed by `run` when given), owned by
        the block as `owned` says."""

        async def spawn() -> Ran[Worker]:
            worker = await self.spawn(code, phase=phase)
            return Ran(f"worker pid {worker.pid}", worker)

        if run is None:
            spawned = await spawn()
        else:
            spawned = await run(phase, spawn, deadline_s=deadline_s or self.model.deadlines.start_s)
        async with self.owned(spawned.value) as held:
            yield held

    def place(self, worker: Worker, *, serving: bool) -> None:
        """The serving worker on this model's CPUs, any other worker on the rest (its
        builds keep themselves on the rest: worker/placement.py). Nothing when the model is
        not pinned, or for a worker that has exited (its pid may already be another's)."""
        if self.cpus is None or worker.pid is None or not worker.alive:
            return
        moved = pin_process(worker.pid, self.cpus if serving else self.cpus_rest)
        if not moved and worker.alive and not self._pin_failed:
            self._pin_failed = True  # said once
            self.events.emit(
                CpusFailed(
                    model=self.model.name,
                    pid=worker.pid,
                    detail="could not move every thread of the worker; it runs where it is",
                )
            )


class Held:
    """A worker a job holds (WorkerFactory.owned): `keep()` once it serves or stands by."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.kept = False

    def keep(self) -> Worker:
        self.kept = True
        return self.worker

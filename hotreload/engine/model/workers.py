"""Where a supervisor gets its worker processes: the one seam its tests replace.

A real `WorkerFactory` starts `WorkerProcess`es; the stepped supervisor tests hand the
supervisor a factory of scripted fake workers that answer the same ops (protocol/ops.py).
Placement on CPUs lives here too: it acts on processes, not on the model's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from hotreload.config import Config, ModelConfig
from hotreload.engine.cpus import pin_process
from hotreload.engine.model.jobs import PhaseFailed
from hotreload.engine.worker_proc import WorkerDied, WorkerProcess, WorkerReplyError

#: Niceness of a standby worker's start-up (imports): it takes spare CPU only.
STANDBY_NICE = 10
#: A standby's start deadline, in units of `deadlines.start_s`.
STANDBY_START_FACTOR = 10


class Spawner(Protocol):
    def __call__(
        self, generation: int, code: dict[str, Any] | None, *, standby: bool
    ) -> WorkerProcess: ...


class WorkerFactory:
    """Starts a model's worker processes and places them on its CPUs."""

    def __init__(self, model: ModelConfig, config: Config, make: Spawner | None = None) -> None:
        self.model = model
        self.config = config
        self._make = make or self._process
        #: The serving worker's own CPUs, and everything else's (None: not pinned). Set by
        #: the session from its CpuPlan before any worker starts.
        self.cpus: frozenset[int] | None = None
        self.cpus_rest: frozenset[int] = frozenset()
        self._pin_failed = False
        #: Told once when a worker could not be moved onto its CPUs.
        self.on_pin_failed: Callable[[int], None] | None = None

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
        generation: int,
        code: dict[str, Any] | None = None,
        *,
        standby: bool = False,
        phase: str = "spawn",
    ) -> WorkerProcess:
        """A started worker; PhaseFailed(`phase`) when it cannot start. Nothing is left
        behind on failure or cancellation."""
        worker = self._make(generation, code, standby=standby)
        # A standby imports at idle priority on cores busy serving: give it time.
        deadline = self.model.deadlines.start_s * (STANDBY_START_FACTOR if standby else 1)
        try:
            await worker.start(deadline)
        except (WorkerDied, WorkerReplyError, TimeoutError) as exc:
            await worker.kill()
            raise PhaseFailed(phase, f"worker failed to start: {exc}") from exc
        except BaseException:
            await worker.kill()  # cancelled (shutdown): never leave a process behind
            raise
        return worker

    def place(self, worker: WorkerProcess, *, serving: bool) -> None:
        """The serving worker on this model's CPUs, any other worker on the rest (its
        builds keep themselves on the rest: worker/placement.py). Nothing when the model is
        not pinned, or for a worker that has exited (its pid may already be another's)."""
        if self.cpus is None or worker.pid is None or not worker.alive:
            return
        moved = pin_process(worker.pid, self.cpus if serving else self.cpus_rest)
        if not moved and worker.alive and not self._pin_failed:
            self._pin_failed = True
            if self.on_pin_failed is not None:
                self.on_pin_failed(worker.pid)

"""One served model: its worker process, its router, its version and its state.

The host brings a version up (load -> warm -> smoke -> swap), restarts a worker that dies
(requests in flight are retried once), and kills a worker whose forward hangs past its
deadline, because a forward stuck in a kernel cannot be interrupted from inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from hotreload.config import Config, ModelConfig
from hotreload.engine.cpus import pin_process
from hotreload.engine.events import EventBus
from hotreload.engine.router import ModelRouter
from hotreload.engine.signature import describe_dynamic
from hotreload.engine.snapshots import Snapshot, code_paths
from hotreload.engine.worker_proc import WorkerDied, WorkerProcess, WorkerReplyError
from hotreload.errors import WorkerUnavailableError

#: States shown to users (status, dashboard).
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
    #: Digest of the example's output, when weights are declared (worker/weights.py).
    output_digest: str | None = None


#: Niceness of a standby worker's start-up (imports): it takes spare CPU only.
STANDBY_NICE = 10
#: A standby's start deadline, in units of `deadlines.start_s`.
STANDBY_START_FACTOR = 10


class BringUpError(Exception):
    """A phase of bringing a version up failed; `phase` names it."""

    def __init__(self, phase: str, message: str, remote_traceback: str | None = None) -> None:
        self.phase = phase
        self.remote_traceback = remote_traceback
        super().__init__(message)


class ModelHost:
    def __init__(self, model: ModelConfig, config: Config, events: EventBus) -> None:
        self.model = model
        self.config = config
        self.events = events
        self.router = ModelRouter(
            name=model.name,
            max_queue_size=model.max_queue_size,
            request_timeout_s=model.request_timeout_s,
            max_inflight=model.max_inflight,
        )
        self.worker: WorkerProcess | None = None
        self.state = "stopped"
        self.current: VersionInfo | None = None
        #: The highest version this session served: a load after an unload goes on from it,
        #: so a version number never names two different builds within a session.
        self.last_version = 0
        self.generation = 0
        self.restarts = 0
        self.last_error: str | None = None
        self.last_worker_status: dict[str, Any] = {}
        self._worker_status_at = 0.0
        self.started_at = time.time()
        self._restart_task: asyncio.Task[None] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._stopping = False
        #: Notes about this model's versions already said (each is said once).
        self._said: set[str] = set()
        #: Copy of the code and weights of the version serving now (None: use the disk).
        self.good_snapshot: Snapshot | None = None
        #: strategy "respawn": the worker started ahead of time for the next reload.
        self.standby: WorkerProcess | None = None
        #: strategy "respawn": the worker a reload just replaced, while it drains and syncs.
        self.retiring: WorkerProcess | None = None
        #: The phase of the reload running now (events and Xid reports are tagged with it).
        self.reload_phase: str | None = None
        #: True while the reloader holds this model: a worker death or a hung forward is then
        #: the reloader's to handle (after its phases), so no restart races its swap.
        self.reloading = False
        #: The serving worker's own CPUs, and everything else's (None: not pinned). Set by
        #: the session from its CpuPlan before any worker starts.
        self.cpus: frozenset[int] | None = None
        self.cpus_rest: frozenset[int] = frozenset()
        self._pin_failed = False
        #: Called after a wedged worker was killed, before its replacement starts.
        self.escalate: Callable[[ModelHost], Awaitable[None]] | None = None

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def version(self) -> int:
        return self.current.version if self.current else 0

    @property
    def next_version(self) -> int:
        """The number the next build gets: one past the highest this session served
        (an in-place swap sets `current` itself, so the serving one counts too)."""
        return max(self.last_version, self.version) + 1

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def restarting(self) -> bool:
        return self._restart_task is not None and not self._restart_task.done()

    async def wait_restart(self) -> None:
        """Return once no restart is running (a reload must not race one for the worker)."""
        task = self._restart_task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(task)

    def set_state(self, state: str, **fields: Any) -> None:
        if state != self.state:
            self.state = state
            self.events.emit("state", model=self.name, state=state, **fields)

    # ------------------------------------------------------------------ worker lifecycle

    async def spawn_worker(
        self, code: dict[str, Any] | None = None, *, standby: bool = False
    ) -> WorkerProcess:
        """A new worker process. A `standby` starts at low priority and stays out of the
        death handling until a reload takes it (`adopt`)."""
        self.generation += 1
        worker = WorkerProcess(
            self.model, self.config, self.generation, code, boot_nice=STANDBY_NICE if standby else 0
        )
        if self.cpus is not None:
            worker.build_cpus = self.cpus_rest
        # A standby imports at idle priority on cores busy serving: give it time.
        deadline = self.model.deadlines.start_s * (STANDBY_START_FACTOR if standby else 1)
        try:
            await worker.start(deadline)
        except (WorkerDied, WorkerReplyError) as exc:
            await worker.kill()
            raise BringUpError("start", f"worker failed to start: {exc}") from exc
        except BaseException:
            await worker.kill()  # cancelled (shutdown): never leave a process behind
            raise
        if standby:
            self.events.emit("standby_ready", model=self.name, pid=worker.pid, recycled=0)
        else:
            self.adopt(worker)
            self.events.emit(
                "worker_started", model=self.name, pid=worker.pid, device=worker.device
            )
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
            self.events.emit(
                "cpus_failed",
                model=self.name,
                pid=worker.pid,
                detail="could not move every thread of the worker; it runs where it is",
            )

    def adopt(self, worker: WorkerProcess) -> None:
        """From now on its death is this model's business (restart, retries)."""
        worker.on_death = self._on_worker_death

    async def bring_up(
        self,
        worker: WorkerProcess,
        version: int,
        *,
        reimport: bool = True,
        previous_outputs: list[dict[str, Any]] | None = None,
    ) -> VersionInfo:
        """load -> warm -> smoke -> swap on `worker`; raises BringUpError naming the phase."""
        d = self.model.deadlines
        info = VersionInfo(version=version)
        try:
            phase = "load"
            r = await worker.request("load", d.load_s, version=version, reimport=reimport)
            info.load_s, info.footprint_bytes = r["load_s"], r["footprint_bytes"]
            info.input_form, info.inputs = r["input_form"], r["inputs"]
            phase = "warm"
            if self.state == "loading":
                self.set_state("warming")
            r = await worker.request(
                "warm", d.warm_s, target="staged", iters=self.model.warmup_iters
            )
            info.warm_s, info.warm_passes_ms = r["warm_s"], r["passes_ms"]
            phase = "smoke"
            r = await worker.request(
                "smoke", d.smoke_s, target="staged", previous_outputs=previous_outputs
            )
            info.outputs, info.output_digest = r["outputs"], r.get("output_digest")
            self.note(r.get("notes"))
            phase = "swap"
            await worker.request("swap", d.smoke_s)
        except WorkerReplyError as exc:
            raise BringUpError(phase, str(exc), exc.remote_traceback) from exc
        except TimeoutError:
            limit = getattr(d, f"{phase}_s", d.smoke_s)
            raise BringUpError(
                phase, f"{phase} did not finish within its {limit:g} s deadline"
            ) from None
        except WorkerDied as exc:
            raise BringUpError(phase, f"worker died during {phase}: {exc}") from exc
        return info

    async def start(self) -> None:
        """Spawn the worker and serve the next version (v1 at the session's start). Raises
        BringUpError when it cannot."""
        self.set_state("starting")
        worker = await self.spawn_worker()
        self.set_state("loading", pid=worker.pid)
        try:
            info = await self.bring_up(worker, self.next_version)
        except BringUpError as exc:
            await worker.stop(self.model.deadlines.stop_s)
            self.set_state("failed", error=str(exc))
            self.last_error = str(exc)
            # Its requests are answered at once (the other models keep serving), until a
            # reload brings it up (`open_gate` clears this).
            self.router.unavailable_reason = (
                f"model {self.name!r} failed to start ({exc.phase}: {exc}); fix it, then "
                f"reload it (save it under `watch`, or `hotreload reload {self.name}`)"
            )
            raise
        except BaseException:
            await worker.kill()  # cancelled (Ctrl-C during the first load)
            raise
        self._install(worker, info)
        self.ensure_watchdog()

    def _install(
        self,
        worker: WorkerProcess,
        info: VersionInfo,
        *,
        announce: bool = True,
        handover: bool = False,
    ) -> None:
        """Make `worker` serving `info` the live one and open the gate. With `handover`,
        requests in flight on the previous worker finish there (see ModelRouter.handover)."""
        previous, self.worker = self.worker, worker
        self.current = info
        self.last_version = max(self.last_version, info.version)
        if previous is not worker:  # an in-place reload keeps its place
            self.place(worker, serving=True)
            if previous is not None and not handover:
                # Drained already, or dead. One handed over from keeps the serving CPUs
                # until its requests are done (respawn moves it then).
                self.place(previous, serving=False)
        # Requests are checked against the serving version's inputs, switched at the swap.
        self.router.input_form, self.router.input_signature = info.input_form, info.inputs
        self.set_state("serving", version=info.version)
        if announce:
            self.events.emit(
                "ready",
                model=self.name,
                version=info.version,
                device=worker.device,
                pid=worker.pid,
                load_s=info.load_s,
                warm_s=info.warm_s,
                inputs=describe_dynamic(info.inputs),
            )
        if handover:
            self.router.handover(worker)
        else:
            self.router.worker = worker
            self.router.open_gate()

    def note(self, notes: list[str] | None) -> None:
        """Say each of a version's notes (outputs left out of replies) once per session."""
        for text in notes or []:
            if text not in self._said:
                self._said.add(text)
                self.events.emit("model_note", model=self.name, message=text)

    # ------------------------------------------------------------------ failure handling

    def _on_worker_death(self, worker: WorkerProcess) -> None:
        if self._stopping or worker is not self.worker:
            return
        self.events.emit("worker_died", model=self.name, pid=worker.pid, reason=worker.exit_reason)
        if self.reloading:
            return  # the reloader restarts it once its own phases have unwound
        self.schedule_restart(reason=worker.exit_reason or "worker died")

    def schedule_restart(self, reason: str, *, wedged: bool = False) -> None:
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.create_task(
                self._restart(reason, wedged=wedged), name=f"restart-{self.name}"
            )

    async def _restart(self, reason: str, attempts: int = 3, *, wedged: bool = False) -> None:
        """Replace a dead or wedged worker with a fresh one serving the same version."""
        self.router.close_gate()
        self.set_state("restarting", reason=reason)
        old = self.worker
        if old is not None and old.alive:
            await old.kill()
        if wedged and self.escalate is not None:
            # The GPU layer decides (config `[gpu] reset`) whether a reset is allowed now.
            await self.escalate(self)
        version = self.version or 1
        # The files on disk may hold a broken edit now: come back on the last good copy.
        code = code_paths(self.model, self.config.root, self.good_snapshot)
        rewritten = self.good_snapshot.rewritten() if self.good_snapshot else []
        if rewritten:
            self.events.emit(
                "snapshot_rewritten",
                model=self.name,
                files=[str(p) for p in rewritten],
                message=f"{', '.join(p.name for p in rewritten)} rewritten in place since "
                f"v{version} loaded (large files are linked, not copied): the restart loads "
                "the current contents; save weights to a new file and rename it over the old "
                "to keep a restart on the last good bytes",
            )
        delay = 0.2
        for attempt in range(1, attempts + 1):
            if self._stopping:
                return
            worker: WorkerProcess | None = None
            try:
                worker = await self.spawn_worker(code)
                info = await self.bring_up(worker, version)
            except asyncio.CancelledError:
                if worker is not None:
                    await worker.kill()
                raise
            except BringUpError as exc:
                self.last_error = f"restart {attempt}/{attempts} failed in {exc.phase}: {exc}"
                self.events.emit(
                    "restart_failed",
                    model=self.name,
                    attempt=attempt,
                    phase=exc.phase,
                    error=str(exc),
                )
                if worker is not None:
                    await worker.kill()
                await asyncio.sleep(delay)
                delay *= 2
                continue
            self.restarts += 1
            self.events.emit(
                "worker_restarted", model=self.name, pid=worker.pid, version=version, reason=reason
            )
            self._install(worker, info)
            return
        self.set_state("failed", error=self.last_error)
        self.router.unavailable_reason = (
            f"model {self.name!r} has no worker: {self.last_error}; fix the error and save, "
            "or run `hotreload reload`"
        )
        self.router.fail_queued(
            WorkerUnavailableError(
                f"model {self.name!r}: worker could not be restarted: {self.last_error}"
            )
        )

    async def restart_now(self, reason: str, *, wedged: bool = False) -> None:
        """Kill the worker and restart it on the last good version; returns when done."""
        self.schedule_restart(reason, wedged=wedged)
        assert self._restart_task is not None
        await asyncio.shield(self._restart_task)

    def ensure_watchdog(self) -> None:
        if self._watchdog_task is None or self._watchdog_task.done():
            self._watchdog_task = asyncio.create_task(
                self._watch_forwards(), name=f"watchdog-{self.name}"
            )

    async def unload(self) -> None:
        """Stop serving this model (repository API `unload`); a reload brings it back."""
        self.router.close_gate()
        await self.router.drain(self.model.deadlines.drain_wait_s)
        self.router.fail_queued(WorkerUnavailableError(f"model {self.name!r} was unloaded"))
        self.router.unavailable_reason = f"model {self.name!r} is unloaded; load it to serve again"
        worker, self.worker = self.worker, None
        self.router.worker = None
        if worker is not None:
            await worker.stop(self.model.deadlines.stop_s)
        self.last_version = max(self.last_version, self.version)
        self.current = None
        self.set_state("unloaded")

    async def _watch_forwards(self, interval_s: float = 0.25) -> None:
        """Kill and respawn a worker whose oldest in-flight request exceeds forward_s."""
        limit = self.model.deadlines.forward_s
        while not self._stopping:
            await asyncio.sleep(min(interval_s, limit / 4))
            age = self.router.oldest_inflight_age()
            if (
                age > limit
                and self.worker is not None
                and self.worker.alive
                and not self.restarting
                # A reload's drain (or in-band swap) behind the hung forward hits its own
                # deadline and recovers; a restart now would race the reload for the worker.
                and not self.reloading
            ):
                self.set_state("wedged", forward_s=age)
                self.events.emit(
                    "wedged",
                    model=self.name,
                    phase=self.reload_phase or "serve",
                    detail=f"a forward has run for {age:.1f} s (limit {limit:g} s)",
                )
                self.schedule_restart(reason=f"forward hung for {age:.1f} s", wedged=True)

    # ------------------------------------------------------------------ status and stop

    async def worker_status(self, timeout_s: float = 1.0, max_age_s: float = 0.0) -> dict[str, Any]:
        """The worker's own figures (RSS, allocator); a reading younger than `max_age_s` is
        reused, because each one costs the worker's serving thread a moment of the GIL."""
        worker = self.worker
        if worker is None or not worker.alive:
            return self.last_worker_status
        if max_age_s and time.monotonic() - self._worker_status_at < max_age_s:
            return self.last_worker_status
        try:
            self.last_worker_status = await worker.request("status", timeout_s)
            self._worker_status_at = time.monotonic()
        except (TimeoutError, WorkerDied, WorkerReplyError):
            pass
        return self.last_worker_status

    async def status(self, worker_max_age_s: float = 0.0) -> dict[str, Any]:
        ws = await self.worker_status(max_age_s=worker_max_age_s)
        limit = self.worker.memory_limit() if self.worker else None
        return {
            "name": self.name,
            "state": self.state,
            "version": self.version,
            "device": (self.worker.device if self.worker else None) or self.model.device,
            "policy": self.model.policy,
            "strategy": self.model.strategy,
            "pid": self.worker.pid if self.worker else None,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "load_s": self.current.load_s if self.current else None,
            "warm_s": self.current.warm_s if self.current else None,
            "warm_passes_ms": self.current.warm_passes_ms if self.current else [],
            "outputs": self.current.outputs if self.current else [],
            "inputs": self.router.input_signature,
            "input_form": self.router.input_form,
            **self.router.snapshot(),
            "worker": {
                k: ws.get(k)
                for k in (
                    "rss_bytes",
                    "allocator",
                    "served",
                    "failed",
                    "threads",
                    "torch",
                    "streams",
                )
                if k in ws
            },
            "standby": self._standby_status(),
            # The cgroup memory limit the serving worker runs under (None: no limit).
            "memory_limit_bytes": limit.limit_bytes if limit else None,
            # Where the serving worker runs, and everything else (None: not pinned).
            "cpus": None
            if self.cpus is None
            else {"serving": sorted(self.cpus), "rest": sorted(self.cpus_rest)},
        }

    def _standby_status(self) -> dict[str, Any] | None:
        """The idle worker waiting for the next reload (strategy respawn): one more process
        holding memory, so it shows. Read from outside: asking it would wake it up."""
        worker = self.standby
        if worker is None or not worker.alive or worker.pid is None:
            return None
        try:
            rss = psutil.Process(worker.pid).memory_info().rss
        except psutil.Error:
            rss = None
        return {"pid": worker.pid, "rss_bytes": rss, "reuses": worker.recycled}

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Drain in-flight requests, stop the worker, fail what is still queued."""
        self._stopping = True
        for task in (self._watchdog_task, self._restart_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.set_state("draining")
        if self.worker is not None and self.worker.alive and self.router.unavailable_reason is None:
            # A reload cancelled by the shutdown may have left the gate closed.
            self.router.open_gate()
        # Let queued requests finish while the gate stays open, up to the drain deadline.
        timeout = drain_timeout_s if drain_timeout_s is not None else self.model.deadlines.drain_s
        deadline = time.monotonic() + timeout
        while (self.router.depth or self.router.inflight) and time.monotonic() < deadline:
            if not (self.worker and self.worker.alive):
                break
            await asyncio.sleep(0.01)
        self.router.close_gate()
        await self.router.drain(max(0.0, deadline - time.monotonic()))
        self.router.fail_queued(
            WorkerUnavailableError(f"model {self.name!r}: server is shutting down")
        )
        if self.worker is not None:
            await self.worker.stop(self.model.deadlines.stop_s)
        self.set_state("stopped")

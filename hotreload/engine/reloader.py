"""The reload protocol, one reloader per model: every phase timed, evented and bounded.

availability (load before unload):
    load -> warm -> smoke (old version keeps serving) -> gate -> drain -> sync -> swap
    -> resume -> release
resource (unload first, for models that cannot co-reside):
    gate -> drain -> sync -> release (offload the old version, kept to restore) -> load
    -> warm -> smoke -> swap -> resume
auto: availability when free memory covers the last measured footprint with margin.

Strategies: `inplace` re-imports the user's code in the same worker; `respawn` builds the new
version in a fresh worker process (a fresh CUDA context: no stale streams at all).

A failure in load, warm or smoke leaves the old version serving (or restores it). A drain or
sync past its deadline means a wedged worker: it is killed and restarted on the last good
snapshot. Reloads are serialized per device (see locks.py); requests made while one runs
collapse into a single follow-up reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from hotreload.engine.host import ModelHost, VersionInfo
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.snapshots import Snapshot, SnapshotTooLarge, code_paths, take_snapshot
from hotreload.engine.worker_proc import WorkerDied, WorkerProcess, WorkerReplyError
from hotreload.paths import ensure_state_dir

T = TypeVar("T")
MIB = 2**20
#: Headroom `auto` wants above the new version's footprint before it loads next to the old.
AUTO_MARGIN_BYTES = 256 * MIB
AUTO_MARGIN_RATIO = 0.2


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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PhaseFailed(Exception):
    def __init__(self, phase: str, message: str, remote_traceback: str | None = None) -> None:
        self.phase = phase
        self.remote_traceback = remote_traceback
        super().__init__(message)


class Wedged(PhaseFailed):
    """Drain or sync past its deadline: the worker must be killed."""


@dataclass
class _Job:
    trigger: str
    detail: list[str]
    weights_only: bool
    future: asyncio.Future[ReloadOutcome]

    def merge(self, trigger: str, detail: list[str], weights_only: bool) -> None:
        if trigger not in self.trigger.split("+"):
            self.trigger += "+" + trigger
        self.detail += [d for d in detail if d not in self.detail]
        # One code change among the edits means the code must be re-imported.
        self.weights_only = self.weights_only and weights_only


class Reloader:
    def __init__(
        self,
        host: ModelHost,
        locks: DeviceLocks,
        *,
        ignore: IgnoreRules | None = None,
        snapshot_dir: Path | None = None,
    ) -> None:
        self.host = host
        self.locks = locks
        self.events = host.events
        self.ignore = ignore or IgnoreRules()
        self.snapshot_dir = snapshot_dir
        self.history: list[ReloadOutcome] = []
        self._running: _Job | None = None
        self._pending: _Job | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._running is not None

    # ------------------------------------------------------------------ queueing

    async def request(
        self, trigger: str, detail: list[str] | None = None, *, weights_only: bool = False
    ) -> ReloadOutcome:
        """Ask for a reload and wait for its outcome. While one runs, requests collapse into
        exactly one follow-up reload (with the newest files), whose outcome they all get."""
        detail = list(detail or [])
        if self._closed:
            # A reload asked for during shutdown would start a worker nobody stops.
            return self._not_run(trigger, detail, "the session is stopping; the reload was not run")
        self.events.emit(
            "reload_requested",
            model=self.host.name,
            trigger=trigger,
            detail=", ".join(detail) or None,
            queued=self._running is not None,
        )
        if self._running is None:
            job = _Job(trigger, detail, weights_only, asyncio.get_running_loop().create_future())
            self._running = job
            self._task = asyncio.create_task(self._drive(job), name=f"reload-{self.host.name}")
            return await asyncio.shield(job.future)
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = _Job(trigger, detail, weights_only, loop.create_future())
        else:
            self._pending.merge(trigger, detail, weights_only)
        return await asyncio.shield(self._pending.future)

    def _not_run(self, trigger: str, detail: list[str], why: str) -> ReloadOutcome:
        return ReloadOutcome(
            self.host.name, False, self.host.version, trigger, error=why, detail=detail
        )

    async def _drive(self, job: _Job | None) -> None:
        while job is not None:
            try:
                outcome = await self._execute(job)
            except Exception as exc:
                # A bug of ours, not the user's: say so with the traceback, keep reloading.
                outcome = self._not_run(
                    job.trigger, job.detail, f"internal error during the reload: {exc!r}"
                )
                outcome.traceback = traceback.format_exc()
                self.events.emit(
                    "reload_failed",
                    model=self.host.name,
                    version=outcome.version,
                    phase=None,
                    error=outcome.error,
                    traceback=outcome.traceback,
                    trigger=job.trigger,
                )
            self.history.append(outcome)
            if not job.future.done():
                job.future.set_result(outcome)
            job, self._pending = self._pending, None
            self._running = job

    async def close(self) -> None:
        """Stop reloading (session shutdown): a reload running now is cancelled, and every
        caller still waiting, for it or for the follow-up, gets a failed outcome."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for job in (self._running, self._pending):
            if job is not None and not job.future.done():
                job.future.set_result(
                    self._not_run(
                        job.trigger, job.detail, "the session stopped before the reload finished"
                    )
                )
        self._running = self._pending = None

    # ------------------------------------------------------------------ one reload

    async def _execute(self, job: _Job) -> ReloadOutcome:
        host = self.host
        started = time.monotonic()
        outcome = ReloadOutcome(
            host.name,
            False,
            host.version,
            job.trigger,
            detail=job.detail,
            strategy=host.model.strategy,
        )
        device = (host.worker.device if host.worker else None) or host.model.device
        key = "cpu" if device in ("cpu", "auto") else device
        waited_note: list[str] = []
        async with self.locks.hold(key, on_wait=waited_note.append) as waited:
            if waited > 0.005:
                outcome.phases["lock"] = waited
                self.events.emit(
                    "phase_end",
                    model=host.name,
                    phase="lock",
                    duration_s=waited,
                    ok=True,
                    detail=waited_note[0] if waited_note else None,
                )
            # A worker being restarted (it died, or wedged) is the restart's until it is back.
            await host.wait_restart()
            host.reloading = True
            candidate: Snapshot | None = None
            try:
                candidate = await self._run_strategy(job, outcome)
                outcome.version = host.version
                if outcome.phase is None:
                    outcome.ok = True
                    self._promote(candidate)
                if self._worker_lost():
                    # It died during a phase (a crash in the user's code, the OOM killer):
                    # bring the last good version back now, still holding the device lock.
                    await self._restart_lost_worker(outcome)
            finally:
                host.reload_phase = None
                host.reloading = False
            if self._worker_lost():  # died just now, its death deferred to us
                host.schedule_restart(reason="worker died")
            if not outcome.ok and candidate is not None and not self._is_good(candidate):
                await asyncio.to_thread(_remove, candidate.folder)
        outcome.total_s = time.monotonic() - started
        host.last_error = outcome.error if not outcome.ok else None
        if outcome.ok:
            self.events.emit(
                "reload_done",
                model=host.name,
                version=outcome.version,
                total_s=outcome.total_s,
                policy=outcome.policy,
                strategy=outcome.strategy,
                phases=outcome.phases,
                trigger=outcome.trigger,
            )
        else:
            self.events.emit(
                "reload_failed",
                model=host.name,
                version=outcome.version,
                phase=outcome.phase,
                error=outcome.error,
                traceback=outcome.traceback,
                phases=outcome.phases,
                trigger=outcome.trigger,
            )
        return outcome

    async def _run_strategy(self, job: _Job, outcome: ReloadOutcome) -> Snapshot | None:
        """Pick the policy, snapshot the files, run the reload; returns the snapshot taken."""
        host = self.host
        cold = host.worker is None or not host.worker.alive or host.current is None
        if cold:
            outcome.policy = "start"
        else:
            outcome.policy, reason = await self._choose_policy()
            self.events.emit("policy", model=host.name, policy=outcome.policy, reason=reason)
        candidate = await self._candidate_snapshot(host.version + 1)
        try:
            if cold:
                await self._cold_start(job, outcome, candidate)
            elif host.model.strategy == "respawn":
                await self._respawn(job, outcome, candidate)
            elif outcome.policy == "availability":
                await self._inplace_availability(job, outcome)
            else:
                await self._inplace_resource(job, outcome)
        except PhaseFailed as exc:
            outcome.phase, outcome.error = exc.phase, str(exc)
            outcome.traceback = exc.remote_traceback
            if isinstance(exc, Wedged):
                await self._recover_wedge(exc, outcome)
            elif not self._worker_lost() and host.state not in ("failed", "unloaded"):
                # The old version serves on: let requests held by a closed gate through.
                if host.worker is not None and host.current is not None:
                    host.router.open_gate()
                host.set_state("serving", version=host.version)
        except BaseException:
            # Cancelled (shutdown): the snapshot of a version that never served goes too.
            if candidate is not None and not self._is_good(candidate):
                _remove(candidate.folder)
            raise
        return candidate

    def _is_good(self, snapshot: Snapshot) -> bool:
        good = self.host.good_snapshot
        return good is not None and good.folder == snapshot.folder

    def _worker_lost(self) -> bool:
        """The serving worker died and nothing is bringing it back yet."""
        host = self.host
        return (
            host.worker is not None
            and not host.worker.alive
            and not host.stopping
            and not host.restarting
            and host.state not in ("failed", "unloaded")
        )

    async def _restart_lost_worker(self, outcome: ReloadOutcome) -> None:
        host = self.host
        assert host.worker is not None
        died = host.worker.exit_reason or "worker died"
        await host.restart_now(reason=f"{died} during the reload")
        if host.state == "serving":
            note = f"the worker died ({died}) and was restarted with v{host.version}"
        else:
            note = f"the worker died ({died}) and could not be restarted: {host.last_error}"
        outcome.version = host.version
        if outcome.ok:
            outcome.detail.append(note)  # it died after the new version went live
        else:
            outcome.error = f"{outcome.error}; {note}"

    async def _phase(
        self,
        name: str,
        outcome: ReloadOutcome,
        fn: Callable[[], Awaitable[T]],
        *,
        deadline_s: float | None = None,
        state: str | None = None,
    ) -> T:
        """Run one phase: timed, evented; errors become PhaseFailed naming the phase."""
        host = self.host
        host.reload_phase = name
        if state:
            host.set_state(state)
        self.events.emit("phase_start", model=host.name, phase=name)
        t0 = time.monotonic()
        detail: str | None = None
        ok = True
        skipped = False
        try:
            result = await (asyncio.wait_for(fn(), deadline_s) if deadline_s else fn())
            if isinstance(result, dict):
                skipped = bool(result.get("skipped"))
                detail = result.get("detail") or result.get("reason")
            return result
        except PhaseFailed as exc:
            ok, detail = False, str(exc)
            raise
        except WorkerReplyError as exc:
            ok, detail = False, str(exc)
            raise PhaseFailed(name, str(exc), exc.remote_traceback) from exc
        except TimeoutError:
            ok = False
            detail = f"{name} did not finish within its {deadline_s:g} s deadline"
            raise PhaseFailed(name, detail) from None
        except WorkerDied as exc:
            ok, detail = False, f"worker died during {name}: {exc}"
            raise PhaseFailed(name, detail) from exc
        finally:
            duration = time.monotonic() - t0
            outcome.phases[name] = duration
            self.events.emit(
                "phase_end",
                model=host.name,
                phase=name,
                duration_s=duration,
                ok=ok,
                skipped=skipped,
                detail=detail,
            )

    # ------------------------------------------------------------------ policies

    async def _choose_policy(self) -> tuple[str, str]:
        host = self.host
        configured = host.model.policy
        if configured != "auto":
            return configured, "set in the config"
        need = host.current.footprint_bytes if host.current else 0
        status = await host.worker_status()
        memory = status.get("device_memory")
        if memory:
            free, where = int(memory["free_bytes"]), f"{host.worker.device if host.worker else ''}"
        else:
            free, where = psutil.virtual_memory().available, "host RAM"
        margin = max(AUTO_MARGIN_BYTES, int(need * AUTO_MARGIN_RATIO))
        figures = f"{free / MIB:.0f} MiB free on {where}, last version used {need / MIB:.0f} MiB"
        if free >= need + margin:
            return "availability", f"auto: {figures}: load next to the old version"
        return "resource", f"auto: {figures} (+{margin / MIB:.0f} MiB margin): unload first"

    def _load_fields(self, job: _Job) -> dict[str, Any]:
        # Always load from the live files: a worker restarted on a snapshot goes back to them.
        return {
            "reimport": not job.weights_only,
            "code": code_paths(self.host.model, self.host.config.root),
        }

    async def _load_warm_smoke(
        self, worker: WorkerProcess, version: int, job: _Job, outcome: ReloadOutcome, *, cold: bool
    ) -> VersionInfo:
        d = self.host.model.deadlines
        info = VersionInfo(version=version)
        previous = self.host.current.outputs if self.host.current else None

        async def load() -> dict[str, Any]:
            r = await worker.request("load", None, version=version, **self._load_fields(job))
            info.load_s, info.footprint_bytes = r["load_s"], r["footprint_bytes"]
            info.inputs, info.input_form = r["inputs"], r["input_form"]
            what = (
                "weights only"
                if job.weights_only
                else f"{r.get('reimported', 0)} module(s) re-imported"
            )
            return {"detail": f"{what}, footprint {info.footprint_bytes / MIB:.1f} MiB"}

        async def warm() -> dict[str, Any]:
            r = await worker.request(
                "warm", None, target="staged", iters=self.host.model.warmup_iters
            )
            info.warm_s, info.warm_passes_ms = r["warm_s"], r["passes_ms"]
            passes = ", ".join(f"{p:.1f}" for p in info.warm_passes_ms[:5])
            return {"detail": f"{len(info.warm_passes_ms)} pass(es): {passes} ms"}

        async def smoke() -> dict[str, Any]:
            r = await worker.request("smoke", None, target="staged", previous_outputs=previous)
            info.outputs = r["outputs"]
            sig = ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in info.outputs)
            return {"detail": sig}

        state_load = "loading" if cold or self.host.router.gate_open is False else "reloading"
        await self._phase("load", outcome, load, deadline_s=d.load_s, state=state_load)
        await self._phase(
            "warm", outcome, warm, deadline_s=d.warm_s, state="warming" if cold else None
        )
        await self._phase("smoke", outcome, smoke, deadline_s=d.smoke_s)
        return info

    async def _gate_drain_sync(self, worker: WorkerProcess, outcome: ReloadOutcome) -> None:
        host, d = self.host, self.host.model.deadlines

        async def gate() -> None:
            host.router.close_gate()

        async def drain() -> dict[str, Any]:
            n = host.router.inflight
            if not await host.router.drain(d.drain_s):
                raise Wedged(
                    "drain",
                    f"{host.router.inflight} request(s) still running after the {d.drain_s:g} s "
                    "drain deadline: a forward is hung",
                )
            return {"detail": f"{n} in flight, {host.router.depth} waiting in the queue"}

        async def sync() -> dict[str, Any]:
            r = await worker.request("sync", d.sync_s + 5.0, which="current", deadline_s=d.sync_s)
            if r.get("skipped"):
                return {"skipped": True, "reason": r.get("reason")}
            if not r.get("idle"):
                busy = ", ".join(r.get("busy") or []) or "?"
                raise Wedged(
                    "sync", f"stream(s) still busy after the {d.sync_s:g} s sync deadline: {busy}"
                )
            n, ms = len(r.get("streams", [])), r["waited_s"] * 1000
            return {"detail": f"{n} stream(s) idle in {ms:.1f} ms"}

        await self._phase("gate", outcome, gate, state="draining")
        await self._phase("drain", outcome, drain)
        await self._phase("sync", outcome, sync)

    async def _resume(self, outcome: ReloadOutcome) -> None:
        async def resume() -> None:
            self.host.router.open_gate()
            self.host.set_state("serving", version=self.host.version)

        await self._phase("resume", outcome, resume)

    async def _inplace_availability(self, job: _Job, outcome: ReloadOutcome) -> None:
        host = self.host
        worker = host.worker
        assert worker is not None
        version = host.version + 1
        try:
            info = await self._load_warm_smoke(worker, version, job, outcome, cold=False)
        except PhaseFailed:
            with contextlib.suppress(Exception):
                await worker.request("release", 30.0, which="staged")
            raise
        await self._inband_swap(worker, info, outcome)

        async def release() -> dict[str, Any]:
            r = await worker.request("release", host.model.deadlines.stop_s, which="retired")
            return {"detail": f"freed {r.get('freed_bytes', 0) / MIB:.1f} MiB of device memory"}

        await self._phase("release", outcome, release)

    async def _inband_swap(
        self, worker: WorkerProcess, info: VersionInfo, outcome: ReloadOutcome
    ) -> None:
        """gate, drain, sync and swap without pausing admission (availability, inplace).

        The swap goes to the worker's serving thread behind the requests already sent: when
        it runs, they have all finished (the drain); the thread then polls the old
        version's streams to the sync deadline and switches. New requests keep flowing to
        the worker meanwhile and queue behind the swap, so serving never stops.
        """
        host, d = self.host, self.host.model.deadlines
        reply: dict[str, Any] = {}

        async def gate() -> dict[str, Any]:
            return {"skipped": True, "reason": "in-band swap: admission stays open"}

        async def drain() -> dict[str, Any]:
            n = host.router.inflight
            try:
                reply.update(
                    await asyncio.wait_for(
                        worker.request("swap", None, inband=True, sync_deadline_s=d.sync_s),
                        d.drain_s + d.sync_s,
                    )
                )
            except TimeoutError:
                raise Wedged(
                    "drain",
                    f"requests sent before the swap still running after the {d.drain_s:g} s "
                    "drain deadline: a forward is hung",
                ) from None
            except WorkerReplyError as exc:
                if exc.code == "streams_busy":
                    raise Wedged("sync", str(exc)) from None
                raise
            return {"detail": f"{n} request(s) in flight finished before the swap"}

        async def sync() -> dict[str, Any]:
            s = reply.get("sync") or {}
            if s.get("skipped"):
                return {"skipped": True, "reason": s.get("reason")}
            n, ms = len(s.get("streams", [])), s.get("waited_s", 0.0) * 1000
            return {"detail": f"{n} stream(s) idle after {ms:.1f} ms (polled by the worker)"}

        async def swap() -> None:
            host.current = info
            host.router.input_form, host.router.input_signature = info.input_form, info.inputs
            host.set_state("serving", version=info.version)

        await self._phase("gate", outcome, gate)
        await self._phase("drain", outcome, drain)
        await self._phase("sync", outcome, sync)
        await self._phase("swap", outcome, swap)

    async def _inplace_resource(self, job: _Job, outcome: ReloadOutcome) -> None:
        host = self.host
        worker = host.worker
        assert worker is not None
        version = host.version + 1
        await self._gate_drain_sync(worker, outcome)

        async def release() -> dict[str, Any]:
            await worker.request("offload", host.model.deadlines.stop_s)
            return {"detail": "old version moved to host memory (kept to restore on failure)"}

        await self._phase("release", outcome, release)
        try:
            info = await self._load_warm_smoke(worker, version, job, outcome, cold=False)
        except PhaseFailed:
            await self._restore_old(worker)  # the error is still reported
            raise

        async def swap() -> None:
            await worker.request("swap", 30.0)
            await worker.request("release", host.model.deadlines.stop_s, which="retired")
            host.current = info
            host.router.input_form, host.router.input_signature = info.input_form, info.inputs

        await self._phase("swap", outcome, swap)
        await self._resume(outcome)

    async def _restore_old(self, worker: WorkerProcess) -> None:
        """Resource policy, after a failed load: put the offloaded old version back and serve.

        A worker that died, or cannot restore, is left dead: the reloader then restarts it on
        the last good snapshot.
        """
        if not worker.alive:
            return
        try:
            await worker.request("restore", self.host.model.deadlines.load_s)
        except (WorkerReplyError, WorkerDied, TimeoutError) as exc:
            self.events.emit(
                "restore_failed",
                model=self.host.name,
                error=f"{exc}; restarting the worker on the last good version",
            )
            await worker.kill()
            return
        self.host.router.open_gate()

    async def _spawn_and_build(
        self, job: _Job, outcome: ReloadOutcome, version: int, *, cold: bool
    ) -> tuple[WorkerProcess, VersionInfo]:
        host = self.host
        box: list[WorkerProcess] = []

        async def spawn() -> dict[str, Any]:
            worker = await host.spawn_worker(code_paths(host.model, host.config.root))
            box.append(worker)
            return {"detail": f"worker pid {worker.pid}"}

        try:
            await self._phase("spawn", outcome, spawn, deadline_s=host.model.deadlines.start_s)
            info = await self._load_warm_smoke(box[0], version, job, outcome, cold=cold)
            await box[0].request("swap", 30.0)  # the new worker's own staged -> current
        except (PhaseFailed, WorkerReplyError, WorkerDied, TimeoutError) as exc:
            if box:
                await box[0].kill()
            if isinstance(exc, PhaseFailed):
                raise
            raise PhaseFailed("swap", f"new worker failed to switch: {exc}") from exc
        except Exception as exc:
            if box:
                await box[0].kill()
            raise PhaseFailed("spawn", str(exc)) from exc
        except BaseException:
            if box:
                await box[0].kill()  # cancelled (shutdown): the new worker goes too
            raise
        return box[0], info

    async def _respawn(self, job: _Job, outcome: ReloadOutcome, candidate: Snapshot | None) -> None:
        host = self.host
        old = host.worker
        assert old is not None
        version = host.version + 1
        old_gone: str | None = None
        if outcome.policy == "resource":
            await self._gate_drain_sync(old, outcome)

            async def offload() -> dict[str, Any]:
                await old.request("offload", host.model.deadlines.stop_s)
                return {"detail": "old worker's version moved to host memory"}

            await self._phase("release", outcome, offload)
            try:
                new, info = await self._spawn_and_build(job, outcome, version, cold=False)
            except PhaseFailed:
                await self._restore_old(old)
                raise
        else:
            new, info = await self._spawn_and_build(job, outcome, version, cold=False)
            try:
                await self._gate_drain_sync(old, outcome)
            except PhaseFailed as exc:
                if not isinstance(exc, Wedged) and old.alive:
                    await new.kill()
                    raise
                # The new worker is ready: abandon a wedged or dead old one, no rollback.
                old_gone = "wedged" if isinstance(exc, Wedged) else "died"
                self.events.emit(
                    "wedged" if old_gone == "wedged" else "worker_lost",
                    model=host.name,
                    phase=exc.phase,
                    detail=f"{exc}; old worker abandoned",
                )
                outcome.detail.append(f"old worker {old_gone} in {exc.phase}: abandoned")
            except BaseException:
                await new.kill()
                raise

        async def swap() -> None:
            host.worker = new
            host._install(new, info, announce=False)
            host.router.close_gate()  # reopened by resume

        await self._phase("swap", outcome, swap)
        await self._resume(outcome)

        async def release() -> dict[str, Any]:
            # In-flight requests of a killed old worker are retried on the new one.
            if old_gone:
                await old.kill()
                return {"detail": f"old worker pid {old.pid} killed ({old_gone})"}
            await old.stop(host.model.deadlines.stop_s)
            return {"detail": f"old worker pid {old.pid} stopped"}

        await self._phase("release", outcome, release)

    async def _cold_start(
        self, job: _Job, outcome: ReloadOutcome, candidate: Snapshot | None
    ) -> None:
        """No live worker (first start failed, unloaded, or restarts gave up): start one."""
        host = self.host
        version = host.version + 1
        if host.worker is not None and not host.worker.alive:
            await host.worker.kill()
        new, info = await self._spawn_and_build(job, outcome, version, cold=True)
        host._install(new, info, announce=False)
        host.ensure_watchdog()

    async def _recover_wedge(self, exc: PhaseFailed, outcome: ReloadOutcome) -> None:
        host = self.host
        self.events.emit("wedged", model=host.name, phase=exc.phase, detail=str(exc))
        host.set_state("wedged", phase=exc.phase)
        # cudaStreamSynchronize may never return: only killing the process gets out.
        await host.restart_now(reason=f"wedged in {exc.phase}", wedged=True)
        outcome.error = (
            f"{exc}; the worker was killed and restarted with v{host.version}"
            if host.state == "serving"
            else f"{exc}; the worker was killed and could not be restarted: {host.last_error}"
        )

    # ------------------------------------------------------------------ snapshots

    async def start_host(self) -> None:
        """First start of the model, with the snapshot a later restart falls back to."""
        candidate = await self._candidate_snapshot(1)
        try:
            await self.host.start()
        except BaseException:
            if candidate is not None:
                await asyncio.to_thread(_remove, candidate.folder)
            raise
        self._promote(candidate)

    async def _candidate_snapshot(self, version: int) -> Snapshot | None:
        if self.snapshot_dir is None:
            return None
        base = self.snapshot_dir / self.host.name
        try:
            ensure_state_dir(self.host.config.state_dir)
            return await asyncio.to_thread(
                take_snapshot, base, self.host.model, version, self.ignore
            )
        except (OSError, SnapshotTooLarge) as exc:
            self.events.emit(
                "snapshot_skipped",
                model=self.host.name,
                reason=f"{exc}; a restart will load the files on disk",
            )
            return None

    def _promote(self, candidate: Snapshot | None) -> None:
        old = self.host.good_snapshot
        self.host.good_snapshot = candidate
        if old is not None and candidate is not None and old.folder != candidate.folder:
            _remove(old.folder)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)

"""The reload phases, and the order each policy runs them in for strategy `inplace` (the
phases of `respawn` build on these in respawn.py).

A mixin of `Reloader` (see reloader.py for the protocol): each method runs a group of
phases through `_phase`, which times them, emits their events and turns errors into
`PhaseFailed` naming the phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psutil

from hotreload.engine.host import ModelHost, VersionInfo
from hotreload.engine.memory_limits import cgroup_memory
from hotreload.engine.reload_outcome import PhaseFailed, ReloadJob, ReloadOutcome, Wedged
from hotreload.engine.snapshots import code_paths
from hotreload.engine.worker_proc import WorkerDied, WorkerProcess, WorkerReplyError

T = TypeVar("T")
MIB = 2**20
#: Headroom `auto` wants above the new version's footprint before it loads next to the old.
AUTO_MARGIN_BYTES = 256 * MIB
AUTO_MARGIN_RATIO = 0.2


class ReloadPhases:
    """Phase implementations; `Reloader` supplies host, events and the recovery hooks."""

    host: ModelHost
    events: Any
    #: The weights-override warning was given (once per session per model).
    override_warned: bool

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
        # Only a GPU worker reports device memory; asking a CPU one costs its serving thread
        # a moment of the GIL for nothing.
        on_cpu = host.worker is not None and host.worker.device == "cpu"
        status = {} if on_cpu else await host.worker_status()
        memory = status.get("device_memory")
        if memory:
            free, where = int(memory["free_bytes"]), f"{host.worker.device if host.worker else ''}"
        else:
            free, where = host_memory_free()
        margin = max(AUTO_MARGIN_BYTES, int(need * AUTO_MARGIN_RATIO))
        figures = f"{free / MIB:.0f} MiB free on {where}, last version used {need / MIB:.0f} MiB"
        if free >= need + margin:
            return "availability", f"auto: {figures}: load next to the old version"
        return "resource", f"auto: {figures} (+{margin / MIB:.0f} MiB margin): unload first"

    def _load_fields(self, job: ReloadJob, worker: WorkerProcess) -> dict[str, Any]:
        # Always load from the live files: a worker restarted on a snapshot goes back to them.
        return {
            # A recycled standby still holds the code of the version before last: re-import
            # even for a weights-only change.
            "reimport": not job.weights_only or worker.recycled > 0,
            "code": code_paths(self.host.model, self.host.config.root),
        }

    async def _load_warm_smoke(
        self,
        worker: WorkerProcess,
        version: int,
        job: ReloadJob,
        outcome: ReloadOutcome,
        *,
        cold: bool,
    ) -> VersionInfo:
        d = self.host.model.deadlines
        info = VersionInfo(version=version)
        previous = self.host.current.outputs if self.host.current else None

        def pace() -> dict[str, Any]:
            # A build in another process (respawn) competes with the requests for the CPU
            # only: the worker paces it while another worker is serving some (build_pace).
            # Not while the gate is closed or no worker serves: then requests wait for the
            # build, and pausing it would only make them wait longer.
            host, router = self.host, self.host.router
            serving = host.worker is not None and host.worker.alive and router.gate_open
            busy = worker is not host.worker and serving and router.inflight > 0
            return {"serving_elsewhere": busy}

        async def load() -> dict[str, Any]:
            fields = self._load_fields(job, worker)
            r = await worker.request("load", None, version=version, **fields, **pace())
            info.load_s, info.footprint_bytes = r["load_s"], r["footprint_bytes"]
            info.inputs, info.input_form = r["inputs"], r["input_form"]
            what = (
                f"{r.get('reimported', 0)} module(s) re-imported"
                if fields["reimport"]
                else "weights only"
            )
            detail = f"{what}, footprint {info.footprint_bytes / MIB:.1f} MiB{_paced(r)}"
            return {"detail": detail}

        async def warm() -> dict[str, Any]:
            r = await worker.request(
                "warm", None, target="staged", iters=self.host.model.warmup_iters, **pace()
            )
            info.warm_s, info.warm_passes_ms = r["warm_s"], r["passes_ms"]
            passes = ", ".join(f"{p:.1f}" for p in info.warm_passes_ms[:5])
            return {"detail": f"{len(info.warm_passes_ms)} pass(es): {passes} ms{_paced(r)}"}

        async def smoke() -> dict[str, Any]:
            r = await worker.request(
                "smoke", None, target="staged", previous_outputs=previous, **pace()
            )
            info.outputs, info.output_digest = r["outputs"], r.get("output_digest")
            self.host.note(r.get("notes"))
            sig = ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in info.outputs)
            return {"detail": sig + _paced(r)}

        state_load = "loading" if cold or self.host.router.gate_open is False else "reloading"
        await self._phase("load", outcome, load, deadline_s=d.load_s, state=state_load)
        await self._phase(
            "warm", outcome, warm, deadline_s=d.warm_s, state="warming" if cold else None
        )
        await self._phase("smoke", outcome, smoke, deadline_s=d.smoke_s)
        self._warn_weights_override(job, info)
        return info

    def _warn_weights_override(self, job: ReloadJob, info: VersionInfo) -> None:
        """Once: an edit of the code left the example's output the same to the bit, and
        weights are declared. Likely the edit changed a value build() sets parameters from
        (SCALE), which the weights file then overwrote: without a word, it looks as if
        reloading did not work."""
        host, old = self.host, self.host.current
        if (
            self.override_warned
            or job.weights_only
            or "file" not in job.trigger.split("+")
            or old is None
            or info.output_digest is None
            or info.output_digest != old.output_digest
        ):
            return
        self.override_warned = True
        files = ", ".join(p.name for p in host.model.weights)
        self.events.emit(
            "weights_override",
            model=host.name,
            version=info.version,
            message=(
                f"v{info.version} answers the example exactly as v{old.version} did although "
                f"its code changed: {files} is loaded after build() and overrides the "
                "parameters build() sets, so editing a value they are initialised from changes "
                "nothing; change the weights file, or apply the value in forward() (shown once)"
            ),
        )

    async def _gate_drain_sync(self, worker: WorkerProcess, outcome: ReloadOutcome) -> None:
        host, d = self.host, self.host.model.deadlines

        async def gate() -> None:
            host.router.close_gate()

        async def drain() -> dict[str, Any]:
            n = host.router.inflight
            if not await host.router.drain(d.drain_wait_s):
                raise Wedged(
                    "drain",
                    f"{host.router.inflight} request(s) still running after the "
                    f"{d.drain_wait_s:g} s drain deadline: a forward is hung",
                )
            return {"detail": f"{n} in flight, {host.router.depth} waiting in the queue"}

        await self._phase("gate", outcome, gate, state="draining")
        await self._phase("drain", outcome, drain)
        await self._phase("sync", outcome, lambda: self._sync_streams(worker))

    async def _sync_streams(self, worker: WorkerProcess) -> dict[str, Any]:
        """Wait, to the sync deadline, for the serving version's streams on `worker`."""
        d = self.host.model.deadlines
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

    async def _resume(self, outcome: ReloadOutcome) -> None:
        async def resume() -> None:
            self.host.router.open_gate()
            self.host.set_state("serving", version=self.host.version)

        await self._phase("resume", outcome, resume)

    async def _inplace_availability(self, job: ReloadJob, outcome: ReloadOutcome) -> None:
        host = self.host
        worker = host.worker
        assert worker is not None
        version = host.next_version
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
                        d.drain_wait_s + d.sync_s,
                    )
                )
            except TimeoutError:
                raise Wedged(
                    "drain",
                    "requests sent before the swap still running after the "
                    f"{d.drain_wait_s:g} s drain deadline: a forward is hung",
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

    async def _offload_old(self, worker: WorkerProcess, outcome: ReloadOutcome) -> None:
        """resource policy's release: park the old version in host memory, to restore it
        if the new one fails."""

        async def release() -> dict[str, Any]:
            await worker.request("offload", self.host.model.deadlines.stop_s)
            return {"detail": "old version moved to host memory (kept to restore on failure)"}

        await self._phase("release", outcome, release)

    async def _inplace_resource(self, job: ReloadJob, outcome: ReloadOutcome) -> None:
        host = self.host
        worker = host.worker
        assert worker is not None
        version = host.next_version
        await self._gate_drain_sync(worker, outcome)
        await self._offload_old(worker, outcome)
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


def _paced(reply: dict[str, Any]) -> str:
    """How long a build step paused for the requests being served (build_pace), if at all."""
    paused = float(reply.get("paused_s") or 0.0)
    return f"; paused {paused * 1000:.0f} ms for requests being served" if paused else ""


def host_memory_free() -> tuple[int, str]:
    """Free host memory for a CPU model's next version, and where it was measured: the
    host's available RAM, or what the session's cgroup limit leaves when that is less (a
    container with 2 GiB on a 512 GiB host is out of memory at 2 GiB)."""
    free, where = psutil.virtual_memory().available, "host RAM"
    limit = cgroup_memory()
    if limit is not None and limit.free_bytes < free:
        free = limit.free_bytes
        where = f"the cgroup memory limit ({limit.limit_bytes / MIB:.0f} MiB, {limit.where})"
    return free, where

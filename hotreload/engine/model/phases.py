"""The phases every job is made of, as functions, and the runner that times them.

A `PhaseRunner` runs one phase: it tells the supervisor which phase is running (Xid reports
are tagged with it), times it into the reload's outcome, emits `phase_start`/`phase_end`
(reloads; a start or a restart runs the same phases quietly), and turns a worker's error,
death or a missed deadline into `PhaseFailed` naming the phase.

`build` is the one load -> warm -> smoke path: a model's first start, a restart after a
death and every reload go through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hotreload.engine.model.jobs import PhaseFailed, ReloadJob, ReloadOutcome, Wedged
from hotreload.engine.model.pushes import Overlay, WeightsPlan, adopt_block, plan_weights
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.warm_progress import WarmDeadlineError, wait_for_warm
from hotreload.engine.worker_proc import WorkerDied, WorkerOp, WorkerProcess, WorkerReplyError

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor

T = TypeVar("T")
MIB = 2**20


class PhaseRunner:
    """Runs the phases of one job; `announce=False` for a start or a restart (their
    progress shows as states, and the dashboard's reload history is for reloads)."""

    def __init__(
        self, sup: Supervisor, outcome: ReloadOutcome | None = None, *, announce: bool = True
    ) -> None:
        self.sup = sup
        self.outcome = outcome
        self.announce = announce and outcome is not None

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        deadline_s: float | None = None,
        state: str | None = None,
    ) -> T:
        sup = self.sup
        sup.enter_phase(name)
        if state:
            sup.set_state(state)
        if self.announce:
            sup.events.emit("phase_start", model=sup.name, phase=name)
        t0 = time.monotonic()
        detail: str | None = None
        ok, skipped = True, False
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
            if self.outcome is not None:
                self.outcome.phases[name] = duration
            if self.announce:
                sup.events.emit(
                    "phase_end",
                    model=sup.name,
                    phase=name,
                    duration_s=duration,
                    ok=ok,
                    skipped=skipped,
                    detail=detail,
                )


# ---------------------------------------------------------------------- build


def weights_plan(
    sup: Supervisor, worker: WorkerProcess, mode: str, push: Overlay | None = None
) -> WeightsPlan:
    """Where a build on `worker` takes its weights from (pushes.py has the rule)."""
    rec = sup.record
    block = rec.current.block if rec.current is not None else None
    plan = plan_weights(
        sup.model,
        rec.overlays,
        rec.weights_stat,
        same_worker=worker is rec.serving and worker.alive,
        restart=mode == "restart",
        push=push,
        serving_block=block.descriptor if block is not None else None,
    )
    if plan.lost:
        ids = ", ".join(f"#{o.id}" for o in plan.lost)
        sup.events.emit_once(
            "model_note",
            model=sup.name,
            message=f"weights pushed over CUDA IPC ({ids}) cannot be read again by a new "
            "worker: this build has the files' weights and the later pushes; push again to "
            "serve them",
        )
    return plan


async def build(
    runner: PhaseRunner,
    worker: WorkerProcess,
    version: int,
    *,
    code: dict[str, Any] | None,
    reimport: bool = True,
    mode: str = "reload",
    job: ReloadJob | None = None,
) -> VersionInfo:
    """load -> warm -> smoke of `version` on `worker`, as its staged version.

    `mode` is "start" (the model's first worker: states loading, warming), "restart" (the
    state stays "restarting"), "cold" (a reload with no worker serving) or "reload". The
    weights are the files' with the pushes since laid over them (`sup.weights_plan`), and
    a `job.push` on top.
    """
    sup = runner.sup
    d = sup.model.deadlines
    info = VersionInfo(version=version)
    plan = weights_plan(sup, worker, mode, job.push if job is not None else None)
    info.weights_stat, info.overlays = plan.stat, plan.overlays
    current = sup.record.current
    previous = current.outputs if current is not None and mode != "restart" else None

    def pace() -> dict[str, Any]:
        # A build in another process (respawn) competes with the requests for the CPU only:
        # the worker paces it while another worker is serving some (build_pace). Not while
        # the gate is closed or no worker serves: then requests wait for the build, and
        # pausing it would only make them wait longer.
        serving, router = sup.record.serving, sup.router
        live = serving is not None and serving.alive and router.gate_open
        return {"serving_elsewhere": worker is not serving and live and router.inflight > 0}

    async def load() -> dict[str, Any]:
        fields: dict[str, Any] = {"reimport": reimport, **plan.wire()}
        if code is not None:
            fields["code"] = code
        r = await worker.request(WorkerOp.LOAD, None, version=version, **fields, **pace())
        info.load_s, info.footprint_bytes = r["load_s"], r["footprint_bytes"]
        info.inputs, info.input_form = r["inputs"], r["input_form"]
        info.digest, info.digest_pending = r.get("digest"), bool(r.get("digest_pending"))
        if r.get("shared"):
            info.block = adopt_block(r["shared"])  # read from the files just now
        elif (r.get("reused") or r.get("mapped")) and sup.record.current is not None:
            info.block = sup.record.current.block  # the same memory, shared or mapped
        what = f"{r.get('reimported', 0)} module(s) re-imported" if reimport else "weights only"
        if r.get("reused"):
            what += f", {r['reused']} weight tensor(s) shared with the serving version"
        elif r.get("mapped"):
            what += f", {r['mapped']} weight tensor(s) mapped from the serving worker's memory"
        elif r.get("not_reused"):
            what += f", weights read from the files ({r['not_reused']})"
        if plan.push is not None:
            what += f", {len(plan.push.names)} tensor(s) pushed"
        detail = f"{what}, footprint {info.footprint_bytes / MIB:.1f} MiB{paced(r)}"
        return {"detail": detail}

    async def warm() -> dict[str, Any]:
        reply = worker.request(
            WorkerOp.WARM, None, target="staged", iters=sup.model.warmup_iters, **pace()
        )
        try:  # progress lines while it runs; past warm_s, what to change (warm_progress.py)
            r = await wait_for_warm(
                worker,
                reply,
                deadline_s=d.warm_s,
                iters=sup.model.warmup_iters,
                say=lambda m: sup.events.emit("model_note", model=sup.name, message=m),
            )
        except WarmDeadlineError as exc:
            raise PhaseFailed("warm", str(exc)) from None
        info.warm_s, info.warm_passes_ms = r["warm_s"], r["passes_ms"]
        passes = ", ".join(f"{p:.1f}" for p in info.warm_passes_ms[:5])
        return {"detail": f"{len(info.warm_passes_ms)} pass(es): {passes} ms{paced(r)}"}

    async def smoke() -> dict[str, Any]:
        r = await worker.request(
            WorkerOp.SMOKE, None, target="staged", previous_outputs=previous, **pace()
        )
        info.outputs, info.output_digest = r["outputs"], r.get("output_digest")
        sup.note(r.get("notes"))
        sig = ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in info.outputs)
        return {"detail": sig + paced(r)}

    if mode == "start":
        load_state, warm_state = "loading", "warming"
    elif mode == "restart":
        load_state = warm_state = None
    else:
        cold = mode == "cold"
        load_state = "loading" if cold or not sup.router.gate_open else "reloading"
        warm_state = "warming" if cold else None
    await runner.run("load", load, deadline_s=d.load_s, state=load_state)
    await runner.run("warm", warm, deadline_s=d.warm_s + 5, state=warm_state)  # backstop
    await runner.run("smoke", smoke, deadline_s=d.smoke_s)
    if job is not None:
        sup.warn_weights_override(job, info)
    return info


async def settle_digest(runner: PhaseRunner) -> None:
    """After the swap: the serving version's digest, which its worker hashed in the
    background (a big model's first new answer did not wait for it)."""
    sup = runner.sup
    current, worker = sup.record.current, sup.record.serving
    if current is None or not current.digest_pending or worker is None or not worker.alive:
        return

    async def digest() -> dict[str, Any]:
        r = await worker.request(WorkerOp.DIGEST, None, deadline_s=sup.model.deadlines.load_s)
        sup.note_digest(current, r.get("digest"))
        return {"detail": f"weights {r.get('digest')} (hashed while it served)"}

    try:
        await runner.run("digest", digest, deadline_s=sup.model.deadlines.load_s + 5)
    except PhaseFailed:
        pass  # the version serves all the same; its digest stays unknown (None)
    finally:
        # It runs after the version went live: no phase of the job is left showing (the
        # dashboard read "serving (digest)" after a start).
        sup.enter_phase(None)


async def own_swap(worker: WorkerProcess) -> None:
    """A worker of its own (start, restart, respawn): its staged version becomes current."""
    try:
        await worker.request(WorkerOp.SWAP, 30.0)
    except (WorkerReplyError, WorkerDied, TimeoutError) as exc:
        raise PhaseFailed("swap", f"new worker failed to switch: {exc}") from exc


async def bring_up(
    runner: PhaseRunner,
    version: int,
    *,
    code: dict[str, Any] | None,
    mode: str,
    job: ReloadJob | None = None,
    spawn_phase: str = "spawn",
) -> tuple[WorkerProcess, VersionInfo]:
    """A fresh worker with `version` built and switched to on its side (not yet serving)."""
    sup = runner.sup
    box: list[WorkerProcess] = []

    async def spawn() -> dict[str, Any]:
        box.append(await sup.spawn(code, phase=spawn_phase))
        return {"detail": f"worker pid {box[0].pid}"}

    await runner.run(spawn_phase, spawn, deadline_s=sup.model.deadlines.start_s)
    worker = box[0]
    if mode == "start":
        sup.set_state("loading", pid=worker.pid)
    try:
        info = await build(runner, worker, version, code=code, mode=mode, job=job)
        await own_swap(worker)
    except BaseException:
        await worker.kill()  # failed, or cancelled (shutdown): never leave a process behind
        raise
    return worker, info


# ---------------------------------------------------------------------- around a swap


async def gate_drain_sync(runner: PhaseRunner, worker: WorkerProcess) -> None:
    """Stop admission, wait for the requests in flight, then for the old streams."""
    sup = runner.sup
    router, d = sup.router, sup.model.deadlines

    async def gate() -> None:
        router.close_gate()

    async def drain() -> dict[str, Any]:
        n = router.inflight
        if not await router.drain(d.drain_wait_s):
            raise Wedged(
                "drain",
                f"{router.inflight} request(s) still running after the "
                f"{d.drain_wait_s:g} s drain deadline: a forward is hung",
            )
        return {"detail": f"{n} in flight, {router.depth} waiting in the queue"}

    await runner.run("gate", gate, state="draining")
    await runner.run("drain", drain)
    await runner.run("sync", lambda: sync_streams(runner.sup, worker))


async def sync_streams(sup: Supervisor, worker: WorkerProcess) -> dict[str, Any]:
    """Wait, to the sync deadline, for the serving version's streams on `worker`."""
    d = sup.model.deadlines
    r = await worker.request(WorkerOp.SYNC, d.sync_s + 5.0, which="current", deadline_s=d.sync_s)
    if r.get("skipped"):
        return {"skipped": True, "reason": r.get("reason")}
    if not r.get("idle"):
        busy = ", ".join(r.get("busy") or []) or "?"
        raise Wedged("sync", f"stream(s) still busy after the {d.sync_s:g} s sync deadline: {busy}")
    n, ms = len(r.get("streams", [])), r["waited_s"] * 1000
    return {"detail": f"{n} stream(s) idle in {ms:.1f} ms"}


async def resume(runner: PhaseRunner) -> None:
    async def resume() -> None:
        runner.sup.router.open_gate()
        runner.sup.set_state("serving", version=runner.sup.record.version)

    await runner.run("resume", resume)


async def offload_old(runner: PhaseRunner, worker: WorkerProcess) -> None:
    """The resource policy's release: park the old version in host memory, to restore it
    if the new one fails."""

    async def release() -> dict[str, Any]:
        await worker.request(WorkerOp.OFFLOAD, runner.sup.model.deadlines.stop_s)
        return {"detail": "old version moved to host memory (kept to restore on failure)"}

    await runner.run("release", release)


async def restore_old(sup: Supervisor, worker: WorkerProcess) -> None:
    """Resource policy, after a failed build: put the offloaded old version back and serve.

    A worker that died, or cannot restore, is left dead: the supervisor then restarts it on
    the last good snapshot.
    """
    if not worker.alive:
        return
    try:
        await worker.request(WorkerOp.RESTORE, sup.model.deadlines.load_s)
    except (WorkerReplyError, WorkerDied, TimeoutError) as exc:
        sup.events.emit(
            "restore_failed",
            model=sup.name,
            error=f"{exc}; restarting the worker on the last good version",
        )
        await worker.kill()
        return
    sup.router.open_gate()


def paced(reply: dict[str, Any]) -> str:
    """How long a build step paused for the requests being served (build_pace), if at all."""
    paused = float(reply.get("paused_s") or 0.0)
    return f"; paused {paused * 1000:.0f} ms for requests being served" if paused else ""

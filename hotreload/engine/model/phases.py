"""The phase vocabulary: each step a job is made of, written once, as a function of the
worker it acts on and what it needs, returning what it found. None of them changes the
model's state: the supervisor runs them (its `run` times each one, emits its events and
turns a worker's error into `PhaseFailed` naming the phase) and makes the changes itself.

    build      load -> warm -> smoke of a version, staged beside the serving one
    bring_up   spawn -> build -> the worker's own swap (a start, a restart, a new worker)
    sync       wait, to the sync deadline, for a version's CUDA streams
    inband     the serving worker's swap behind the requests already sent to it
    offload    park the old version in host memory (resource policy), `restore` it back
    release    free the version a swap retired
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hotreload.config import ModelConfig
from hotreload.config.models import Deadlines
from hotreload.engine import golden
from hotreload.engine.checkpoint_ready import wait_until_complete
from hotreload.engine.compile_figures import compile_text
from hotreload.engine.event_kinds import CheckpointWait, ModelNote, PhaseEnd, PhaseStart
from hotreload.engine.events import EventBus
from hotreload.engine.golden import GoldenSet
from hotreload.engine.model.jobs import PhaseFailed, Ran, ReloadOutcome, Skipped, Wedged
from hotreload.engine.model.pushes import (
    Overlay,
    WeightsBlock,
    WeightsPlan,
    adopt_block,
    keep_leaves,
    plan_weights,
)
from hotreload.engine.model.record import ModelRecord, VersionInfo
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.router import ModelRouter, StoppedStreams
from hotreload.engine.served_shapes import REPLAY_SHARE, replayable
from hotreload.engine.snapshots import code_paths
from hotreload.engine.warm_progress import WarmDeadlineError, wait_for_warm
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.messages import (
    DigestReply,
    DigestRequest,
    LoadRequest,
    OffloadRequest,
    ReleaseRequest,
    RestoreRequest,
    SmokeRequest,
    SwapReply,
    SwapRequest,
    SyncReply,
    SyncRequest,
    WarmRequest,
)

T = TypeVar("T")
MIB = 2**20
#: How long streams ended at the drain deadline may take to stop (their next token).
STREAM_END_S = 5.0


class RunPhase(Protocol):
    """Runs one phase: `await run("load", fn, deadline_s=..., state=...)` (`PhaseClock.run`)."""

    async def __call__(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        deadline_s: float | None = None,
        state: str | None = None,
    ) -> T: ...


class PhaseClock:
    """Runs the phases of one job: knows which phase runs (the model's `phase`: Xid
    reports are tagged with it), times each into the reload's outcome, emits
    `phase_start`/`phase_end` (reloads only: a start or a restart shows as states), and
    turns a worker's error, death or a missed deadline into `PhaseFailed` naming it."""

    def __init__(
        self,
        model: str,
        events: EventBus,
        outcome: ReloadOutcome | None,
        set_state: Callable[[str], None],
    ) -> None:
        self.model, self.events, self.outcome = model, events, outcome
        self._set_state = set_state
        self.phase: str | None = None

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        deadline_s: float | None = None,
        state: str | None = None,
    ) -> T:
        self.phase = name
        if state:
            self._set_state(state)
        if self.outcome is not None:
            self.events.emit(PhaseStart(model=self.model, phase=name))
        t0 = time.monotonic()
        detail: str | None = None
        ok, skipped = True, False
        try:
            result = await (asyncio.wait_for(fn(), deadline_s) if deadline_s else fn())
            if isinstance(result, Ran):
                detail = result.detail
            elif isinstance(result, Skipped):
                skipped, detail = True, result.reason
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
                self.events.emit(
                    PhaseEnd(
                        model=self.model,
                        phase=name,
                        duration_s=duration,
                        ok=ok,
                        skipped=skipped,
                        detail=detail,
                    )
                )


@dataclass
class BuildSpec:
    """What a build of one version needs to know, made by the supervisor from its record."""

    version: int
    model: ModelConfig
    #: The user's code (None: what the worker was started with).
    code: dict[str, Any] | None
    reimport: bool = True
    #: "start", "restart", "cold" (a reload with no worker serving) or "reload".
    mode: str = "reload"
    #: The weights as the serving version holds them (pushes.plan_weights has the rule).
    serving: Worker | None = None
    overlays: list[Overlay] = field(default_factory=list)
    weights_stat: tuple[Any, ...] | None = None
    #: The serving version's weights block (respawn: another worker maps it).
    serving_block: WeightsBlock | None = None
    push: Overlay | None = None
    #: Where the weights come from, decided by the caller (a rollback: kept_versions.py),
    #: told whether the build runs in the serving worker; None: pushes.plan_weights's rule.
    weights: Callable[[bool], WeightsPlan] | None = None
    #: The serving version's outputs, for the smoke test's comparison.
    previous_outputs: list[dict[str, Any]] | None = None
    #: The serving version and its golden outputs (engine/golden.py), compared with the
    #: new version's in the smoke phase; where each version's are kept (None: not kept).
    previous_golden: GoldenSet | None = None
    previous_version: int | None = None
    golden_dir: Path | None = None
    #: The states shown during load and warm (None: leave the state as it is).
    load_state: str | None = None
    warm_state: str | None = None
    #: True while another worker is serving requests (a build elsewhere then paces itself).
    serving_busy: Callable[[], bool] = lambda: False
    #: Says a line about the build as it runs (a long warm-up's progress).
    say: Callable[[str], None] = lambda message: None
    #: The input signatures the model served lately (router.served): the warm phase runs
    #: those the new version accepts, so no request after the swap pays their compile.
    served: Callable[[], list[list[dict[str, Any]]]] = lambda: []


async def build(run: RunPhase, worker: Worker, spec: BuildSpec) -> VersionInfo:
    """load -> warm -> smoke of `spec.version` on `worker`, as its staged version. The
    weights are the files', the pushes since laid over them, and `spec.push` on top."""
    d = spec.model.deadlines
    info = VersionInfo(version=spec.version)
    same_worker = worker is spec.serving and worker.alive
    plan = (
        spec.weights(same_worker)
        if spec.weights
        else plan_weights(
            spec.model,
            spec.overlays,
            spec.weights_stat,
            same_worker=same_worker,
            restart=spec.mode == "restart",
            push=spec.push,
            serving_block=spec.serving_block.descriptor if spec.serving_block else None,
        )
    )
    info.weights_stat, info.overlays = plan.stat, plan.overlays
    if plan.lost:
        ids = ", ".join(f"#{o.id}" for o in plan.lost)
        info.notes.append(
            f"weights pushed over CUDA IPC ({ids}) cannot be read again by a new worker: "
            "this build has the files' weights and the later pushes; push again to serve them"
        )

    def elsewhere() -> bool:
        # A build in another process (respawn) competes with the requests for the CPU only:
        # the worker paces it while another worker is serving some (build_pace).
        return worker is not spec.serving and spec.serving_busy()

    copied = False  # the serving module copied, in its own worker (a push: push_copy.py)

    async def load() -> Ran[None] | Skipped:
        nonlocal copied
        r = await worker.load(
            LoadRequest(
                spec.version,
                reimport=spec.reimport,
                code=spec.code,
                **plan.wire(),
                serving_elsewhere=elsewhere(),
            )
        )
        info.load_s, info.footprint_bytes = r.load_s, r.footprint_bytes
        info.inputs, info.input_form = r.inputs, r.input_form
        info.digest, info.digest_pending = r.digest, r.digest_pending
        info.init_digests = r.init_digests
        info.adapters = r.adapters
        info.imports, info.libraries = tuple(r.imports), tuple(r.libraries)
        keep_leaves(plan.overlays, r.overlay_leaves)
        if r.shared:
            info.block = adopt_block(r.shared)  # read from the files just now
        elif (r.reused or r.mapped) and spec.serving_block is not None:
            info.block = spec.serving_block  # the same memory, shared or mapped
        reimported = spec.reimport or r.reimported  # a weights-only build may (stale code)
        what = f"{r.reimported} module(s) re-imported" if reimported else "weights only"
        copied = r.copied
        if r.copied:
            what += ", the serving module copied (no build() call)"
        if r.reused:
            what += f", {r.reused} weight tensor(s) shared with the serving version"
            if r.read_files:  # some files changed (a shard): those read, the rest shared
                what += f", {r.read_files} of {len(spec.model.weights)} weights file(s) read"
        elif r.mapped:
            what += f", {r.mapped} weight tensor(s) mapped from the serving worker's memory"
        elif r.not_reused:
            what += f", weights read from the files ({r.not_reused})"
        if plan.push is not None:
            what += f", {len(plan.push.names)} tensor(s) pushed"
        if r.hashed_bytes is not None:  # the rest of its digest was remembered or mapped
            what += f", digest hashed {size_text(r.hashed_bytes)}"
        return Ran(f"{what}, footprint {info.footprint_bytes / MIB:.1f} MiB{paced(r)}")

    async def warm() -> Ran[None] | Skipped:
        if copied and worker.device == "cpu":  # the serving version's code, shapes, process:
            # its lazy inits and kernel choices are made (a CUDA one has a stream of its own)
            return Skipped("the serving module copied: warm already")
        iters = spec.model.warmup_iters
        # Newest first: `replay_shapes` keeps the most recently served (0: none).
        shapes = replayable(spec.served(), info.input_form, info.inputs)
        shapes = shapes[: spec.model.replay_shapes]
        reply = worker.warm(
            WarmRequest(
                "staged",
                iters,
                serving_elsewhere=elsewhere(),
                shapes=shapes,
                replay_budget_s=d.warm_s * REPLAY_SHARE,
            )
        )
        try:  # progress lines while it runs; past warm_s, what to change (warm_progress.py)
            r = await wait_for_warm(worker, reply, deadline_s=d.warm_s, iters=iters, say=spec.say)
        except WarmDeadlineError as exc:
            raise PhaseFailed("warm", str(exc)) from None
        info.warm_s, info.warm_passes_ms = r.warm_s, r.passes_ms
        info.compile = r.compile
        info.notes.extend(f"warm-up at a served shape failed: {f}" for f in r.replay_failed)
        passes = ", ".join(f"{p:.1f}" for p in info.warm_passes_ms[:5])
        replayed = f", {r.replayed} served shape(s)" if shapes else ""
        compiled = f", {compile_text(r.compile)}" if r.compile else ""
        return Ran(
            f"{len(info.warm_passes_ms)} pass(es): {passes} ms{replayed}{compiled}{paced(r)}"
        )

    async def smoke() -> Ran[None] | Skipped:
        r = await worker.smoke(
            SmokeRequest("staged", spec.previous_outputs, serving_elsewhere=elsewhere())
        )
        info.outputs = r.outputs
        info.imports = tuple(sorted({*info.imports, *r.imports}))
        info.notes.extend(r.notes)
        sig = ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in info.outputs)
        return Ran(sig + await golden_check(spec, info, r.golden, r.payload) + paced(r))

    await run("load", load, deadline_s=d.load_s, state=spec.load_state)
    await run("warm", warm, deadline_s=d.warm_s + 5, state=spec.warm_state)  # a backstop
    await run("smoke", smoke, deadline_s=d.smoke_s)
    return info


async def own_swap(worker: Worker) -> None:
    """A worker's staged version becomes its current one (no requests of its own yet)."""
    try:
        await worker.swap(SwapRequest(), 30.0)
    except (WorkerReplyError, WorkerDied, TimeoutError) as exc:
        raise PhaseFailed("swap", f"new worker failed to switch: {exc}") from exc


async def bring_up(
    run: RunPhase,
    workers: WorkerFactory,
    spec: BuildSpec,
    *,
    spawn_phase: str = "spawn",
    on_spawned: Callable[[Worker], None] | None = None,
) -> tuple[Worker, VersionInfo]:
    """A fresh worker with `spec.version` built and switched to on its side (not serving
    yet). The worker is killed if anything fails or the job is cancelled."""
    async with workers.spawning(spec.code, phase=spawn_phase, run=run) as held:
        if on_spawned is not None:
            on_spawned(held.worker)
        info = await build(run, held.worker, spec)
        await own_swap(held.worker)
        return held.keep(), info


# ---------------------------------------------------------------------- around a swap


async def sync(worker: Worker, sync_s: float) -> Ran[None] | Skipped:
    """Wait, to the sync deadline, for the current version's streams on `worker`."""
    r = await worker.sync(SyncRequest("current", sync_s), sync_s + 5.0)
    if r.skipped:
        return Skipped(r.reason)
    if not r.idle:
        busy = ", ".join(r.busy) or "?"
        raise Wedged("sync", f"stream(s) still busy after the {sync_s:g} s sync deadline: {busy}")
    return Ran(f"{len(r.streams)} stream(s) idle in {r.waited_s * 1000:.1f} ms")


async def in_band(
    run: RunPhase,
    worker: Worker,
    deadlines: Deadlines,
    router: ModelRouter,
    install: Callable[[], None],
    *,
    version: int,
) -> None:
    """gate, drain, sync, swap and release of `version`, built in the serving worker,
    without pausing admission. The swap goes to the worker's serving thread behind the
    requests already sent: when it runs they have all finished (the drain); the thread then
    polls the old version's streams to the sync deadline (the sync) and switches, and
    `install` points the model at the new version. New requests keep flowing meanwhile and
    queue behind the swap, so serving never stops. Streamed requests ahead of the swap
    still running at the drain deadline (`drain_s`) are ended there (router.end_streams)."""

    drain_wait_s, sync_s, stop_s = deadlines.drain_wait_s, deadlines.sync_s, deadlines.stop_s

    async def gate() -> Ran[None] | Skipped:
        return Skipped("in-band swap: admission stays open")

    async def drain() -> Ran[SyncReply]:
        n = ahead = 0  # what the swap queues behind: read as its frame is sent

        async def swap_behind() -> SwapReply:
            nonlocal n, ahead
            # Read in the task, in the turn its frame is submitted (`swap` sends before
            # it first waits): a reply landing between the task's creation and its first
            # step pumps a queued stream ahead of the swap, which must count as ahead.
            n, ahead = router.inflight, router.sent
            request = SwapRequest(inband=True, sync_deadline_s=sync_s)
            return await worker.swap(request, drain_wait_s + sync_s)

        swapping = asyncio.ensure_future(swap_behind())
        ended = StoppedStreams()
        try:
            if not (await asyncio.wait({swapping}, timeout=deadlines.drain_s))[0]:
                # The swap waits on the serving thread, so a stream ahead of it ends here:
                # its client is told the reload, the swap runs at its next token.
                drain_s = deadlines.drain_s
                ended = router.end_streams(version, drain_s, worker=worker, sent_up_to=ahead)
            swapped = await swapping
        except TimeoutError:
            raise Wedged(
                "drain",
                "requests sent before the swap still running after the "
                f"{drain_wait_s:g} s drain deadline: a forward is hung",
            ) from None
        except WorkerReplyError as exc:
            if exc.code == "streams_busy":
                raise Wedged("sync", str(exc)) from None
            raise
        finally:
            swapping.cancel()  # done already, or the job was cancelled: no swap left behind
        polled = swapped.sync or SyncReply(skipped=True, reason="not reported")
        done = f"{n} request(s) in flight finished before the swap"
        return Ran(done + ended_text(ended, deadlines), polled)

    async def sync(r: SyncReply) -> Ran[None] | Skipped:
        if r.skipped:
            return Skipped(r.reason)
        n, ms = len(r.streams), r.waited_s * 1000
        return Ran(f"{n} stream(s) idle after {ms:.1f} ms (polled by the worker)")

    async def swap() -> None:
        install()

    await run("gate", gate)
    drained = await run("drain", drain)
    await run("sync", lambda: sync(drained.value))
    await run("swap", swap)
    await run("release", lambda: release(worker, "retired", stop_s))


async def drain_streams(
    wait: Callable[[float], Awaitable[bool]],
    d: Deadlines,
    end_streams: Callable[[], StoppedStreams],
) -> tuple[bool, StoppedStreams]:
    """Wait for the requests in flight to the drain deadline, `drain_wait_s`, ending the
    streamed ones still running at `drain_s`: a stream can stop at any token (its client is
    told the reload, router.end_streams), a forward cannot (it has until forward_s). Whether
    all finished, and the streams stopped (ended, or moved to the new version: those stop
    at their next token too, so they are waited for as long)."""
    if await wait(min(d.drain_s, d.drain_wait_s)):
        return True, StoppedStreams()
    stopped = end_streams()
    left = d.drain_wait_s - d.drain_s
    return await wait(max(left, STREAM_END_S) if stopped else left), stopped


def ended_text(stopped: StoppedStreams, d: Deadlines) -> str:
    out = f"; {stopped.ended} stream(s) ended at the {d.drain_s:g} s drain deadline"
    moved = f"; {stopped.moved} stream(s) not started yet moved to the new version"
    return (out if stopped.ended else "") + (moved if stopped.moved else "")


async def offload(worker: Worker, stop_s: float) -> Ran[None]:
    """The resource policy's release: the old version goes to host memory, to restore if
    the new one fails."""
    await worker.offload(OffloadRequest(), stop_s)
    return Ran("old version moved to host memory (kept to restore on failure)")


async def restore(worker: Worker, load_s: float) -> str | None:
    """After a failed build (resource policy): the offloaded old version back. Returns why
    it could not be (the worker is then killed, and restarted by the supervisor)."""
    if not worker.alive:
        return None
    try:
        await worker.restore(RestoreRequest(), load_s)
    except (WorkerReplyError, WorkerDied, TimeoutError) as exc:
        await worker.end()
        return f"{exc}; restarting the worker on the last good version"
    return None


async def release(worker: Worker, which: str, stop_s: float) -> Ran[None]:
    """Free one of the worker's versions ("retired" after a swap, "staged" after a failed
    build) and empty the allocator cache."""
    r = await worker.release(ReleaseRequest(which), stop_s)
    return Ran(f"freed {r.freed_bytes / MIB:.1f} MiB of device memory")


async def digest(worker: Worker) -> DigestReply:
    """The serving version's weights digest, which its worker hashed while it served: its
    adapters' digests, the bytes hashed, the leaves of the block it read."""
    return await worker.digest(DigestRequest())


def paced(reply: Any) -> str:
    """How long a build step paused for the requests being served (build_pace), if at all."""
    paused = float(getattr(reply, "paused_s", 0.0) or 0.0)
    return f"; paused {paused * 1000:.0f} ms for requests being served" if paused else ""


async def wait_for_checkpoints(run: RunPhase, model: ModelConfig, events: EventBus) -> None:
    """A weights file still being written (a trainer's save) is waited for, to
    `deadlines.checkpoint_s`, instead of failing to load: a phase only when it has to wait,
    and a failed one, naming each file, when the wait runs out. A missing file is the
    load's to report, at once: nothing is writing it."""
    adapter_files = [a.weights_file for a in model.adapters]  # peft writes them in place
    files = [p for p in (*model.weights, *adapter_files) if p.exists()]
    if not files or not await wait_until_complete(files, deadline_s=0):
        return  # complete (one look at each file's structure): no phase to show
    deadline = model.deadlines.checkpoint_s
    waited: list[str] = []

    def on_wait(path: Path, problem: str) -> None:
        waited.append(f"{path.name} ({problem})")
        events.emit(
            CheckpointWait(
                model=model.name,
                file=str(path),
                message=f"waiting up to {deadline:g} s for {path.name} to be complete ({problem})",
            )
        )

    async def checkpoint() -> Ran[None] | Skipped:
        left = await wait_until_complete(files, deadline_s=deadline, on_wait=on_wait)
        if left:
            problems = "; ".join(f"{p.name}: {why}" for p, why in left.items())
            raise PhaseFailed(
                "checkpoint",
                f"weights still incomplete after the {deadline:g} s checkpoint deadline "
                f"({problems}); save to a temporary file and rename it over the old one",
            )
        return Ran("waited for " + "; ".join(waited))

    await run("checkpoint", checkpoint)


def make_spec(
    model: ModelConfig,
    root: Path,
    record: ModelRecord,
    router: ModelRouter,
    mode: str,
    job: Any = None,
    push: Overlay | None = None,
    events: EventBus | None = None,
    golden_dir: Path | None = None,
) -> BuildSpec:
    """What the next build needs from a model's record. `mode`: "start", "restart", "cold",
    "reload" or "push_elsewhere" (a push built in another worker: the serving version's code
    from its snapshot, imported there); `job`: the reload (jobs.ReloadJob) whose build takes
    the user's code from the files again, as does a start (None: a push runs the serving
    code again)."""
    current = record.current
    job_code, weights_only = job is not None, bool(job is not None and job.weights_only)
    if mode == "start":
        load_state, warm_state = "loading", "warming"
    elif mode == "restart":
        load_state = warm_state = None
    else:
        cold = mode == "cold"
        load_state = "loading" if cold or not router.gate_open else "reloading"
        warm_state = "warming" if cold else None
    if mode in ("restart", "push_elsewhere"):
        code = code_paths(model, root, record.good_snapshot)
    else:  # the files as this build's snapshot found them (worker/fresh_source.py)
        from_files = job_code or mode == "start"
        code = code_paths(model, root, sources=record.build_snapshot) if from_files else None

    def serving_busy() -> bool:
        serving = record.serving
        live = serving is not None and serving.alive and router.gate_open
        return live and router.inflight > 0

    return BuildSpec(
        version=(record.version or 1) if mode == "restart" else record.next_version,
        model=model,
        code=code,
        reimport=(not weights_only) if job_code else mode in ("start", "restart", "push_elsewhere"),
        mode=mode,
        serving=record.serving,
        overlays=record.overlays,
        weights_stat=record.weights_stat,
        serving_block=current.block if current is not None else None,
        push=push,
        previous_outputs=current.outputs if current is not None and mode != "restart" else None,
        previous_golden=current.golden if current is not None and mode != "restart" else None,
        previous_version=current.version if current is not None else None,
        golden_dir=golden_dir if mode != "restart" else None,
        load_state=load_state,
        warm_state=warm_state,
        serving_busy=serving_busy,
        say=(lambda m: events.emit(ModelNote(model=model.name, message=m)))
        if events
        else say_nothing,
        served=router.served.recent,
    )


async def golden_check(
    spec: BuildSpec, info: VersionInfo, wire: dict[str, Any] | None, payload: Any = None
) -> str:
    """The new version's golden outputs (`wire`, their bytes in `payload`) compared with the
    serving version's (the smoke phase's detail says how), kept in `spec.golden_dir`;
    PhaseFailed when `expect = "same"` and they changed: the serving version serves on.
    The store only serves `hotreload diff`: a write that fails is a note, never a failed
    build; anything else that goes wrong here fails the smoke phase, saying what."""

    def read_and_compare() -> tuple[GoldenSet, dict[str, Any] | None]:
        got = golden.from_wire(wire or {}, payload)
        sent = any(o is not None for o in got.outputs) or got.texts
        if spec.previous_golden is None or not sent:  # none sent: the worker's note says why
            return got, None
        return got, golden.compare(
            spec.previous_golden,
            got,
            tolerance=spec.model.tolerance,
            old_version=spec.previous_version,
            new_version=spec.version,
        )

    async def keep(write: Callable[..., None], *args: Any) -> None:
        # OSError (a full disk, permissions) is a note: `hotreload diff` misses this
        # version, the build goes on. The folder, not a temporary file: one note each time.
        try:
            await asyncio.to_thread(write, *args)
        except OSError as exc:
            info.notes.append(
                f"golden outputs not kept for `hotreload diff` in {spec.golden_dir} "
                f"({exc.strerror or exc}); free space, or make that folder writable"
            )

    store = golden.GoldenStore(spec.golden_dir) if spec.golden_dir is not None else None
    try:
        if store is not None and spec.mode == "start":
            # Version numbers restart with each session: the files of the last one go.
            await keep(store.begin_session, golden.session_marker())
        if wire is None:
            return ""
        # Off the loop: 16 MiB of outputs took ~0.7 s to read and compare on it.
        info.golden, diff = await asyncio.to_thread(read_and_compare)
        if diff is not None:
            if spec.model.expect == "same" and not diff["same"]:
                raise PhaseFailed("smoke", golden.refusal(diff))
            info.golden_diff = diff
        if store is not None:
            await keep(store.save, spec.version, info.golden)
        return f"; {golden.summary(info.golden_diff)}" if info.golden_diff else ""
    except PhaseFailed:
        raise
    except Exception as exc:
        raise PhaseFailed(
            "smoke", f"golden outputs could not be compared: {type(exc).__name__}: {exc}"
        ) from exc


def say_nothing(message: str) -> None:
    """A build nobody is told about."""


def size_text(n: int) -> str:
    """Bytes in MiB, or in KiB below a tenth of one (a push of a few tensors)."""
    return f"{n / MIB:.1f} MiB" if n >= MIB // 10 else f"{n / 1024:.0f} KiB"

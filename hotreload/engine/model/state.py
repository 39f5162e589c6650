"""The one writer of a model's state: its record (record.py) and its router's gate.

The supervisor decides what happens and in which order; every change it makes to which
worker serves, which version, the state shown, the phase running, the standby worker and the
router's admission is a method here. Nothing else assigns a field of the record or opens,
closes or points the router (tests/supervisor/test_ownership.py checks both), so one page
says how a model's state can move. Readers (status, the dashboard, HTTP) read a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.engine.event_kinds import (
    LockWait,
    ModelNote,
    PhaseEnd,
    Ready,
    RecycleDisabled,
    ReloadDone,
    ReloadFailed,
    SnapshotSkipped,
    State,
)
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import kept_versions, phases, pushes, snapshot_keeper, unchanged
from hotreload.engine.model.jobs import PhaseFailed, Ran, ReloadOutcome
from hotreload.engine.model.phases import PhaseClock, RunPhase
from hotreload.engine.model.record import ModelRecord, ModelView, VersionInfo
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.router import ModelRouter
from hotreload.engine.signature import describe_dynamic, inputs_change
from hotreload.engine.snapshots import Snapshot
from hotreload.engine.worker_port import Worker
from hotreload.errors import ClientError, WorkerUnavailableError


class ModelState:
    """A model's record and router, and the only code that changes them."""

    def __init__(
        self,
        model: ModelConfig,
        ignore: IgnoreRules,
        events: EventBus,
        router: ModelRouter,
        workers: WorkerFactory,
    ) -> None:
        #: The model's settings (its `[[models]]` section) and what never reloads it:
        #: written by `use_settings` only, read by everything else through here.
        self.model, self.ignore = model, ignore
        self.name = model.name
        self.events = events
        self.router = router
        self.workers = workers
        self.record = ModelRecord()
        #: While a reload tries new settings: the ones before, the worker they serve in,
        #: and the settings on trial (a live edit meanwhile replaces them: it stays).
        self._trial: tuple[ModelConfig, IgnoreRules, Worker | None, ModelConfig] | None = None
        #: The kept pushes' copy to disk under way (spill_soon), off the job loop.
        self._spill: asyncio.Task[None] | None = None

    def use_settings(self, model: ModelConfig, ignore: IgnoreRules) -> None:
        """Settings edited while the model serves (settings_change.py): builds, spawns and
        the router's limits follow them from now on."""
        self.model, self.ignore = model, ignore
        self.workers.model = model
        self.router.set_limits(model.max_queue_size, model.request_timeout_s, model.max_inflight)

    def try_settings(self, model: ModelConfig, ignore: IgnoreRules) -> None:
        """New settings for one reload job: kept if a worker built with them serves at its
        end (`end_trial`), else the old ones come back."""
        self._trial = (self.model, self.ignore, self.record.serving, model)
        self.use_settings(model, ignore)

    def end_trial(self) -> None:
        """The job ends, or restarts the old worker: the settings on trial go unless a
        worker built with them serves, or a live edit replaced them meanwhile (the file
        says those now). Acts once."""
        if self._trial is None:
            return
        model, ignore, old, tried = self._trial
        self._trial = None
        if self.model is tried and self.record.serving in (old, None):
            self.use_settings(model, ignore)

    # ------------------------------------------------------------------ states and phases

    def set_state(self, state: str, **fields: Any) -> None:
        if state != self.record.state:
            self.record.state = state
            self.events.emit(State(model=self.name, state=state, **fields))

    def note_error(self, error: str | None) -> None:
        self.record.last_error = error

    def stop_recycling(self, why: str) -> None:
        """The model's workers are no longer reused (said once): its code fails a second
        import in one process (respawn.py)."""
        if self.record.recycle_off is None:
            self.record.recycle_off = why
            self.events.emit(RecycleDisabled(model=self.name, reason=why))

    def note_tried(self, files: tuple[str, ...]) -> None:
        """A build failed: the files it tried to import stay watched until a new version."""
        if files:
            self.record.tried_imports = tuple(sorted({*self.record.tried_imports, *files}))

    def runner(self, outcome: ReloadOutcome | None) -> RunPhase:
        """The phase runner of a job (phases.PhaseClock): the phase it runs is the
        model's `phase`; a reload's phases go into `outcome` and the event stream."""
        clock = PhaseClock(self.name, self.events, outcome, self.set_state)
        self.record.clock = clock
        return clock.run

    def job_done(self) -> None:
        """No phase of the job is left showing."""
        self.record.clock = None

    def view(self) -> ModelView:
        """The snapshot front ends read (record.ModelView): built from the record and the
        router here, so that none of them holds either."""
        rec, router = self.record, self.router
        cur, worker = rec.current, rec.serving
        return ModelView(
            name=self.model.name,
            state=rec.state,
            version=rec.version,
            digest=cur.digest if cur else None,
            device=(worker.device if worker else None) or self.model.device,
            pid=worker.pid if worker else None,
            restarts=rec.restarts,
            last_error=rec.last_error,
            phase=rec.phase,
            has_version=cur is not None,
            load_s=cur.load_s if cur else 0.0,
            warm_s=cur.warm_s if cur else 0.0,
            warm_passes_ms=tuple(cur.warm_passes_ms) if cur else (),
            outputs=tuple(cur.outputs) if cur else (),
            inputs=tuple(router.input_signature),
            input_form=router.input_form,
            queue_depth=router.depth,
            queue_limit=router.max_queue_size,
            inflight=router.inflight,
            requests=router.counters.as_dict(),
            text=router.text_stats.summary(),
            adapters=cur.adapters if cur else None,
            compile=cur.compile if cur else None,
        )

    # ------------------------------------------------------------------ which worker serves

    def install(
        self,
        worker: Worker,
        info: VersionInfo,
        *,
        announce: bool = True,
        handover: bool = False,
        open_gate: bool = True,
    ) -> None:
        """Make `worker` serving `info` the live one. With `handover`, requests in flight on
        the previous worker finish there (ModelRouter.handover); without `open_gate`, the
        gate stays as it is (a swap behind a closed gate, reopened by `open_gate`)."""
        rec, router = self.record, self.router
        previous, rec.serving = rec.serving, worker
        if rec.current is not None and rec.current.block not in (None, info.block):
            rec.current.block.close()  # the files changed: the old worker's mapping is its own
        if rec.current is None or info.version != rec.current.version:
            rec.tried_imports = ()  # a new version: its own imports say what it uses
        if not info.libraries and rec.current is not None:
            info.libraries = rec.current.libraries  # a push imports nothing: they stand
        rec.current = info
        rec.last_version = max(rec.last_version, info.version)
        # The weights it serves: the files as it found them and the pushes it holds; pushes
        # no version needs any more (the files changed since) let go of their memory.
        for overlay in rec.overlays:
            if overlay not in info.overlays and not kept_versions.holds(rec.kept, overlay):
                overlay.close()  # a kept version's pushes stay: a rollback lays them again
        rec.overlays, rec.weights_stat = list(info.overlays), info.weights_stat
        if previous is not worker:  # an in-place reload keeps its place
            self.workers.place(worker, serving=True)
            if previous is not None and not handover:
                # Drained already, or dead. One handed over from keeps the serving CPUs
                # until its requests are done (the hand-over moves it then).
                self.workers.place(previous, serving=False)
        # Requests are checked against the serving version's inputs, switched at the swap.
        router.input_form, router.input_signature = info.input_form, info.inputs
        self.set_state("serving", version=info.version)
        for text in info.notes:  # outputs left out of replies, once per session
            self.events.emit_once(ModelNote(model=self.name, message=text))
        if announce:
            self.events.emit(
                Ready(
                    model=self.name,
                    version=info.version,
                    device=worker.device,
                    pid=worker.pid,
                    load_s=info.load_s,
                    warm_s=info.warm_s,
                    inputs=describe_dynamic(info.inputs),
                    digest=info.digest,
                )
            )
        if handover:
            router.handover(worker)
        else:
            router.worker = worker
            if open_gate:
                router.open_gate()
        # Last: requests waiting for this version (`min_version`) go to its worker.
        router.serving_version(info.version)

    def unserve(self, why: str) -> Worker | None:
        """Nobody serves any more (unload): returns the worker that did."""
        rec, router = self.record, self.router
        router.unavailable_reason = why
        worker, rec.serving = rec.serving, None
        router.worker = None
        rec.last_version = max(rec.last_version, rec.version)
        if rec.current is not None and rec.current.block is not None:
            rec.current.block.close()
        rec.current = None
        return worker

    def set_retiring(self, worker: Worker | None) -> None:
        """The worker a swap replaced, while it drains and syncs (strategy respawn)."""
        self.record.retiring = worker

    def set_standby(self, worker: Worker | None) -> Worker | None:
        """The worker started ahead of time for the next reload; returns the one before."""
        old, self.record.standby = self.record.standby, worker
        return old

    def count_restart(self) -> None:
        self.record.restarts += 1

    def finish(
        self, outcome: ReloadOutcome, started: float, inputs_before: list[Any] | None = None
    ) -> ReloadOutcome:
        """A reload or push is over: its outcome into the history and the event stream
        (with what requests must now send, when the reload changed the inputs)."""
        outcome.total_s = time.monotonic() - started
        self.record.last_error = outcome.error if not outcome.ok else None
        self.record.history.append(outcome)
        current = self.record.current
        if current is not None:
            outcome.digest, outcome.adapters = current.digest, current.adapters
        fields: dict[str, Any] = {
            "model": self.name,
            "version": outcome.version,
            "total_s": outcome.total_s,
            "policy": outcome.policy,
            "strategy": outcome.strategy,
            "phases": outcome.phases,
            "trigger": outcome.trigger,
            "phase": outcome.phase,
            "error": outcome.error,
            "traceback": outcome.traceback,
            "digest": current.digest if current else None,
        }
        if not outcome.ok:
            self.events.emit(ReloadFailed(**fields))
            return outcome
        change = inputs_change(inputs_before, current.inputs) if inputs_before and current else None
        same = outcome.detail[-1] if outcome.unchanged and outcome.detail else None
        built = current.compile if current is not None and not outcome.unchanged else None
        diff = current.golden_diff if current is not None and not outcome.unchanged else None
        self.events.emit(
            ReloadDone(
                **fields,
                inputs_changed=change,
                unchanged=same,
                compile=built,
                golden=diff,
                rollback_of=outcome.rollback_of,
            )
        )
        return outcome

    def serve_on(self) -> None:
        """A build failed and the old version serves on: requests held by a closed gate go
        through (unless the model failed or was unloaded meanwhile)."""
        rec = self.record
        if rec.state in ("failed", "unloaded"):
            return
        if rec.serving is not None and rec.current is not None:
            self.open_gate()
        self.set_state("serving", version=rec.version)

    # ------------------------------------------------------------------ admission

    def set_latency_windows(self, latency: Any, queue: Any) -> None:
        self.router.latency, self.router.queue_latency = latency, queue

    def open_gate(self) -> None:
        self.router.open_gate()

    def close_gate(self) -> None:
        self.router.close_gate()

    def refuse(self, why: str, error: ClientError | None = None) -> None:
        """Answer requests with `why` until a version serves again; `error` fails the ones
        queued now."""
        self.router.unavailable_reason = why
        if error is not None:
            self.router.fail_queued(error)

    def refuse_until_reload(self, why: str) -> None:
        self.router.refuse_until_reload(why)

    def fail_queued(self, error: ClientError) -> None:
        self.router.fail_queued(error)

    def blame_hung(self, worker: Worker) -> None:
        """`worker` is about to be killed as wedged: a request it has run past `forward_s`
        is the one told it hung; the others it holds are retried."""
        self.router.hung_on(worker, self.model.deadlines.forward_s)

    # ------------------------------------------------------------------ what a version keeps

    async def snapshot(
        self, folder: Path | None, config: Config, ignore: IgnoreRules, version: int
    ) -> Snapshot | None:
        """A copy of the files `version` builds from, for a restart to come back on."""
        taken = await snapshot_keeper.candidate(
            folder, config, self.model, version, ignore, self.record.good_snapshot
        )
        if isinstance(taken, str):
            self.events.emit(SnapshotSkipped(model=self.name, reason=taken))
            taken = None
        self.record.build_snapshot = taken  # the build reads the code from it
        return taken

    async def promote(
        self, snapshot: Snapshot | None, trigger: str = "start", rollback_of: int | None = None
    ) -> None:
        """`snapshot`'s version serves now: a restart comes back on it, and it is kept for a
        rollback (`keep_versions`); the snapshots no kept version holds any more go."""
        rec = self.record
        old, rec.good_snapshot = rec.good_snapshot, snapshot
        gone = self.keep_version(trigger, rollback_of)
        replaced = snapshot_keeper.replaced(old, snapshot)
        if replaced is not None and all(k.snapshot.folder != replaced.folder for k in rec.kept):
            gone.append(replaced)
        for unused in gone:
            await snapshot_keeper.discard(unused)
        self.record.weights_sha = await asyncio.to_thread(
            unchanged.weights_sha, self.model, self.record.weights_stat, self.record.weights_sha
        )

    def keep_version(self, trigger: str, rollback_of: int | None = None) -> list[Snapshot]:
        """The serving version joins the kept ones (kept_versions.py), if a snapshot holds
        its files; returns the snapshots no kept version holds any more. The pushes of the
        versions dropped that nothing serves or keeps let go of their memory."""
        rec = self.record
        if rec.current is None or rec.good_snapshot is None:
            return []
        entry = kept_versions.KeptVersion(
            rec.version, rec.good_snapshot, tuple(rec.overlays), rec.weights_stat,
            rec.current.digest, trigger, rollback_of, self.model,
        )  # fmt: skip
        rec.kept, dropped = kept_versions.kept_after(rec.kept, entry, self.model.keep_versions)
        for k in dropped:
            for overlay in k.overlays:
                if overlay not in rec.overlays and not kept_versions.holds(rec.kept, overlay):
                    overlay.close()
        for spilled in kept_versions.unused_spills(dropped, rec.kept):
            spilled.unlink(missing_ok=True)  # a push only dropped versions held
        in_use = (rec.good_snapshot, rec.build_snapshot)
        return kept_versions.unused_snapshots(dropped, rec.kept, *in_use)

    def note_eval(
        self, info: VersionInfo, outcome: ReloadOutcome | None, result: dict[str, Any]
    ) -> None:
        """A version's eval (evals.py): on the version, and on the history row that made it."""
        info.eval = result
        if outcome is not None:
            outcome.eval = result

    def spill_soon(self) -> None:
        """`spill_kept` as a task beside the job loop (a copy of a large push takes a while):
        the next job awaits it first (`spilled`), before it changes what is kept."""
        if self._spill is None or self._spill.done():
            self._spill = asyncio.create_task(self.spill_kept(), name=f"spill-{self.name}")

    async def spilled(self) -> None:
        """Until the spill under way (`spill_soon`), if any, has ended."""
        if self._spill is not None:
            await asyncio.wait([self._spill])
            self._spill = None

    async def spill_kept(self) -> None:
        """Kept pushes no serving version holds go to disk and let go of their memory
        (kept_versions.spill); one that cannot be written stays in memory, said once. With
        too little free disk (kept_versions.NoRoom) the kept versions that hold it are
        dropped, oldest first, said so: neither the disk nor memory fills up."""
        for overlay, folder in kept_versions.unheld_pushes(self.record.kept, self.record.overlays):
            try:
                await asyncio.to_thread(kept_versions.spill, overlay, folder)
            except kept_versions.NoRoom as exc:
                await self._drop_kept_holding(overlay, str(exc))
            except OSError as exc:
                self.events.emit_once(
                    ModelNote(
                        model=self.name,
                        message=f"push #{overlay.id} kept in memory for a rollback: its copy "
                        f"to {folder} failed ({exc})",
                    )
                )

    async def _drop_kept_holding(self, overlay: pushes.Overlay, why: str) -> None:
        """The kept versions holding `overlay` (none serves) go, its memory with them."""
        rec = self.record
        dropped = [k for k in rec.kept if overlay in k.overlays]
        rec.kept = [k for k in rec.kept if overlay not in k.overlays]
        overlay.close()
        names = ", ".join(f"v{k.version}" for k in dropped)
        self.events.emit(
            ModelNote(
                model=self.name,
                message=f"{names} no longer kept for a rollback: push #{overlay.id} they hold "
                f"cannot be copied to disk ({why}); free disk space or lower keep_versions",
            )
        )
        in_use = (rec.good_snapshot, rec.build_snapshot)
        for unused in kept_versions.unused_snapshots(dropped, rec.kept, *in_use):
            await snapshot_keeper.discard(unused)

    async def settle_digest(self, run: RunPhase) -> None:
        """After the swap: the serving version's digest, which its worker hashed in the
        background (a big model's first new answer did not wait for it)."""
        current, worker = self.record.current, self.record.serving
        if current is None or not current.digest_pending or worker is None or not worker.alive:
            return
        load_s = self.model.deadlines.load_s

        async def digest() -> Ran[None]:
            r = await phases.digest(worker)
            current.digest, current.digest_pending = r.digest, False
            current.adapters = r.adapters or current.adapters
            if current.block is not None and r.block_leaves is not None:
                current.block.descriptor["leaves"] = r.block_leaves  # for the next mapper
            pushes.keep_leaves(current.overlays, r.overlay_leaves)
            hashed = r.hashed_bytes
            size = f", {phases.size_text(hashed)} hashed" if hashed is not None else ""
            return Ran(f"weights {current.digest} (hashed while it served{size})")

        try:
            await run("digest", digest, deadline_s=load_s + 5)
        except PhaseFailed:
            current.digest_pending = False  # it serves all the same; its digest stays unknown
        finally:
            # It runs after the version went live: no phase of the job is left showing (the
            # dashboard read "serving (digest)" after a start).
            self.record.clock = None

    @contextlib.asynccontextmanager
    async def device_lock(
        self,
        locks: DeviceLocks,
        outcome: ReloadOutcome | None = None,
        worker: Worker | None = None,
    ) -> AsyncIterator[None]:
        """The lock of the device the model runs on: one build at a time per device. A wait
        past a second is said at once (who holds it), not only when it ends. `worker`: the
        one about to build (a start's), whose device its hello said."""
        held = worker or self.record.serving
        # "auto" not yet resolved by a worker (a cold build after an unload) may be a GPU:
        # as a key of its own it takes the lock shared across sessions, as a GPU's does.
        key = (held.device if held else None) or self.model.device
        waited_note: list[str] = []

        def waiting(line: str) -> None:
            waited_note.append(line)
            self.events.emit(LockWait(model=self.name, device=key, message=line))

        async with locks.hold(key, on_wait=waiting, model=self.name) as waited:
            if waited > 0.005 and outcome is not None:
                outcome.phases["lock"] = waited
                self.events.emit(
                    PhaseEnd(
                        model=self.name,
                        phase="lock",
                        duration_s=waited,
                        ok=True,
                        detail=waited_note[0] if waited_note else None,
                    )
                )
            yield

    # ------------------------------------------------------------------ the end

    async def unload(self) -> None:
        """Stop serving (repository API `unload`): gate, drain, stop the worker."""
        d = self.model.deadlines
        self.close_gate()
        # Streams still running at drain_s end naming the unload, as at a reload (else they
        # held it to drain_wait_s, and their clients read that their worker failed).
        why = "model unloading; load it to serve again"
        await phases.drain_streams(
            self.router.drain, d, lambda: self.router.end_streams(0, d.drain_s, why=why)
        )
        self.fail_queued(WorkerUnavailableError(f"model {self.name!r} was unloaded"))
        worker = self.unserve(f"model {self.name!r} is unloaded; load it to serve again")
        if worker is not None:
            await worker.end(d.stop_s)
        self.set_state("unloaded")

    async def drain_and_stop(self, drain_timeout_s: float | None) -> None:
        """Let queued requests finish to the drain deadline, fail the rest, stop the worker."""
        rec, router = self.record, self.router
        self.set_state("draining")
        if rec.serving is not None and rec.serving.alive and router.unavailable_reason is None:
            self.open_gate()  # a reload cancelled by the shutdown may have left it closed
        timeout = drain_timeout_s if drain_timeout_s is not None else self.model.deadlines.drain_s
        deadline = time.monotonic() + timeout
        while (router.depth or router.inflight) and time.monotonic() < deadline:
            if not (rec.serving and rec.serving.alive):
                break
            await asyncio.sleep(0.01)
        self.close_gate()
        await router.drain(max(0.0, deadline - time.monotonic()))
        why = "server shutting down"
        if router.end_streams(0, timeout, why=why):
            # Told the shutdown, not that their worker failed: they stop at their next token.
            await router.drain(phases.STREAM_END_S)
        self.fail_queued(WorkerUnavailableError(f"model {self.name!r}: server is shutting down"))
        if rec.serving is not None:
            await rec.serving.end(self.model.deadlines.stop_s)
        self.set_state("stopped")
        for overlay in [*rec.overlays, *(o for k in rec.kept for o in k.overlays)]:
            overlay.close()
        if rec.current is not None and rec.current.block is not None:
            rec.current.block.close()

"""A model's first start and its last stop (the jobs `start` and `stop` of supervisor.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from hotreload.engine.model import phases, snapshot_keeper
from hotreload.engine.model.jobs import PhaseFailed
from hotreload.engine.model.phases import PhaseRunner
from hotreload.engine.worker_proc import WorkerProcess
from hotreload.errors import WorkerUnavailableError

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor


async def run_start(sup: Supervisor) -> None:
    """The model's first worker: spawn (outside the device lock), build, serve."""
    version = sup.record.next_version
    candidate = await snapshot_keeper.candidate(sup, version)
    runner = PhaseRunner(sup)
    sup.set_state("starting")
    worker: WorkerProcess | None = None
    try:
        # The process starts (torch's import) outside the device lock: only the build
        # touches the device, and several models may start side by side.
        worker = await sup.spawn(None, phase="start")
        sup.set_state("loading", pid=worker.pid)
        async with sup.device_lock():
            info = await phases.build(runner, worker, version, code=None, mode="start")
            await phases.own_swap(worker)
    except PhaseFailed as exc:
        if worker is not None:
            await worker.stop(sup.model.deadlines.stop_s)
        sup.set_state("failed", error=str(exc))
        sup.note_error(str(exc))
        sup.router.refuse_until_reload(f"failed to start ({exc.phase}: {exc})")
        await snapshot_keeper.discard(candidate)
        raise
    except BaseException:
        if worker is not None:
            await worker.kill()  # cancelled (Ctrl-C during the first load)
        await snapshot_keeper.discard(candidate)
        raise
    finally:
        sup.enter_phase(None)
    sup.install(worker, info)
    await phases.settle_digest(runner)
    await snapshot_keeper.promote(sup, candidate)
    sup.ensure_watchdog()


async def drain_and_stop(sup: Supervisor, drain_timeout_s: float | None) -> None:
    """Let queued requests finish to the drain deadline, fail the rest, stop the worker."""
    rec, router = sup.record, sup.router
    sup.set_state("draining")
    if rec.serving is not None and rec.serving.alive and router.unavailable_reason is None:
        router.open_gate()  # a reload cancelled by the shutdown may have left it closed
    # Let queued requests finish while the gate stays open, up to the drain deadline.
    timeout = drain_timeout_s if drain_timeout_s is not None else sup.model.deadlines.drain_s
    deadline = time.monotonic() + timeout
    while (router.depth or router.inflight) and time.monotonic() < deadline:
        if not (rec.serving and rec.serving.alive):
            break
        await asyncio.sleep(0.01)
    router.close_gate()
    await router.drain(max(0.0, deadline - time.monotonic()))
    router.fail_queued(WorkerUnavailableError(f"model {sup.name!r}: server is shutting down"))
    if rec.serving is not None:
        await rec.serving.stop(sup.model.deadlines.stop_s)
    sup.set_state("stopped")

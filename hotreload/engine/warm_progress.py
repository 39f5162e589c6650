"""A warm-up that runs long: progress lines while it runs, and a deadline message that says
what to change.

The worker warms a staged version on its loader thread and answers `status` on another, so
the manager can ask how many passes are done while it waits. Past `[models.deadlines]
warm_s` the phase fails naming that key, the passes done and the time of one pass: "did not
finish within its 60 s deadline" alone left a user guessing between a hang and a slow model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from hotreload.engine.worker_port import Worker
from hotreload.protocol.messages import StatusRequest, WarmReply


class WarmDeadlineError(Exception):
    """The warm-up passed `[models.deadlines] warm_s`; the message says what to change."""


def progress_every_s(deadline_s: float) -> float:
    """How often a running warm-up reports: every 10 s, or four times within a short
    deadline, so a warm-up that will fail says how far it got first."""
    return min(10.0, max(deadline_s / 4, 0.2))


async def _passes_done(worker: Worker) -> list[float] | None:
    """The staged version's warm-up passes so far (ms each); None when the worker cannot
    say (busy past a second, or gone)."""
    with contextlib.suppress(Exception):
        passes = (await worker.status(StatusRequest(), 1.0)).staged_warm_passes_ms
        return list(passes) if passes is not None else None
    return None


def _per_pass(passes: list[float]) -> str:
    ms = sum(passes) / len(passes)
    return f"{ms / 1000:.2f} s a pass" if ms >= 1000 else f"{ms:.0f} ms a pass"


def deadline_message(deadline_s: float, iters: int, passes: list[float] | None) -> str:
    head = (
        f"warm-up did not finish within its {deadline_s:g} s deadline ([models.deadlines] warm_s)"
    )
    if passes is None:
        return f"{head}; raise warm_s, or lower warmup_iters ({iters})"
    if not passes:
        return (
            f"{head}: the first of {iters} pass(es) ran for all of it (a hung forward, or a "
            "model slower than the deadline); raise warm_s, or look at the model's forward"
        )
    need = sum(passes) / len(passes) * iters / 1000
    return (
        f"{head}: {len(passes)} of {iters} pass(es) done, {_per_pass(passes)}; "
        f"the {iters} passes need about {need:.0f} s: raise warm_s past that, or lower "
        "warmup_iters"
    )


async def wait_for_warm(
    worker: Worker,
    warm: Awaitable[WarmReply],
    *,
    deadline_s: float,
    iters: int,
    say: Callable[[str], None],
) -> WarmReply:
    """Await the worker's warm-up reply, saying how far it got every `progress_every_s`;
    WarmDeadlineError past `deadline_s`."""
    task = asyncio.ensure_future(warm)
    started = time.monotonic()
    every = progress_every_s(deadline_s)
    try:
        while True:
            left = deadline_s - (time.monotonic() - started)
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=min(every, left))
            if done:
                return task.result()
            if deadline_s - (time.monotonic() - started) <= 0:
                break
            passes = await _passes_done(worker)
            if passes is not None:
                took = time.monotonic() - started
                per = f", {_per_pass(passes)}" if passes else ""
                say(f"warm-up: {len(passes)} of {iters} pass(es) done in {took:.1f} s{per}")
        passes = await _passes_done(worker)
        raise WarmDeadlineError(deadline_message(deadline_s, iters, passes))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

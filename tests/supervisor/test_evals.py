"""The eval of each new version on the fake worker (engine/model/evals.py): run after a
start, a reload, a push and a rollback, once the job's caller has its outcome; its figures
on the version, its history row, `status` and an `eval_done` event; an eval that raises or
runs past `eval_timeout_s` is reported and the version serves on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from hotreload.config.models import Deadlines, EntryPoint
from hotreload.engine.event_kinds import EvalDone
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.shared_state import pack_state
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_rollback import Make as KeptMake
from tests.supervisor.test_rollback import edit, with_snapshots
from tests.supervisor.test_supervisor_steps import Make, request, stepped

SCORE = EntryPoint("evals.py:score", None, Path("/p/evals.py"), "score")


def evals_seen(sup: object) -> list[EvalDone]:
    return [e for e in sup.seen if isinstance(e, EvalDone)]  # type: ignore[attr-defined]


async def until_evals(sup: object, n: int) -> list[EvalDone]:
    """The `eval_done` events once there are `n` (an eval follows its job's answer)."""
    for _ in range(500):
        if len(evals_seen(sup)) >= n:
            break
        await asyncio.sleep(0.01)
    return evals_seen(sup)


@stepped
async def test_each_new_version_is_scored_after_its_outcome(make: Make) -> None:
    script = Script()
    script.evals = [{"loss": 1.0}, {"loss": 0.5}, {"loss": 0.25}]
    sup = make(script, eval=SCORE)
    await sup.start()
    script.hold(WorkerOp.EVAL)  # the start's eval waits: the reload does not
    await script.started(WorkerOp.EVAL)
    outcome = await asyncio.wait_for(sup.reload("file", force=True), 5)
    assert outcome.ok and sup.version == 2 and not sup.busy
    assert not evals_seen(sup)  # v1's eval still runs; v2's waits for its result
    script.release(WorkerOp.EVAL)
    first, second = await until_evals(sup, 2)  # answered first, scored after
    assert (first.version, first.figures, second.version, second.figures) == (
        1, {"loss": 1.0}, 2, {"loss": 0.5},
    )  # fmt: skip
    assert outcome.eval is not None and outcome.eval["figures"] == {"loss": 0.5}
    assert sup.history[-1].eval == outcome.eval
    status = await sup.status()
    assert status["eval"]["version"] == 2 and status["eval"]["figures"] == {"loss": 0.5}
    packed = pack_state({"w": np.ones(4, np.float32)}, cuda_ipc=False)
    try:
        await sup.push(packed.descriptor)
    finally:
        packed.close()
    await sup.restart("test")  # the same version in a new worker: not scored again
    assert [e.version for e in await until_evals(sup, 3)] == [1, 2, 3]
    assert evals_seen(sup)[-1].figures == {"loss": 0.25}
    assert [op for op in script.ops() if op == WorkerOp.EVAL] == [WorkerOp.EVAL] * 3


@stepped
async def test_an_eval_that_raises_is_shown_and_the_version_serves_on(make: Make) -> None:
    script = Script()
    script.evals = [{"message": "eval: evals.py:score raised ValueError: boom"}, {"acc": 0.9}]
    sup = make(script, eval=SCORE)
    await sup.start()
    assert (await sup.reload("file", force=True)).ok
    failed, scored = await until_evals(sup, 2)
    assert failed.error is not None and "ValueError: boom" in failed.error
    assert failed.figures is None and sup.state == "serving"
    assert scored.version == 2 and scored.figures == {"acc": 0.9}


@stepped
async def test_an_eval_past_its_deadline_is_reported_and_holds_up_nothing_after(
    make: Make,
) -> None:
    script = Script()
    script.evals = [{"loss": 1.0}]
    sup = make(script, eval=SCORE, eval_timeout_s=0.2)
    script.hold(WorkerOp.EVAL)
    await sup.start()
    outcome = await asyncio.wait_for(sup.reload("file", force=True), 5)
    assert outcome.ok and sup.version == 2
    timed_out = (await until_evals(sup, 1))[0]
    assert timed_out.version == 1 and "did not finish within eval_timeout_s = 0.2 s" in (
        timed_out.error or ""
    )
    script.release(WorkerOp.EVAL)


@stepped
async def test_no_eval_configured_asks_for_none(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    assert (await sup.reload("file", force=True)).ok
    assert WorkerOp.EVAL not in script.ops() and not evals_seen(sup)


@with_snapshots
async def test_a_rollback_is_scored_too(make: KeptMake, model_file: Path) -> None:
    script = Script()
    script.evals = [{"loss": 1.0}, {"loss": 2.0}, {"loss": 1.0}]
    sup = make(script, eval=SCORE)
    await sup.start()
    edit(model_file, "v2")
    assert (await sup.reload("file")).ok
    back = await sup.rollback()
    await until_evals(sup, 3)
    assert back.eval == {"version": 3, "figures": {"loss": 1.0}, "eval_s": 0.001}


@stepped
async def test_a_hung_forward_during_a_held_eval_is_replaced_by_the_watchdog(make: Make) -> None:
    """The eval runs beside the job loop: the watchdog (which acts only while no job runs)
    replaces a worker whose forward hangs by `forward_s`, not by `eval_timeout_s`."""
    script = Script()
    script.evals = [{"loss": 1.0}]
    sup = make(
        script, eval=SCORE, eval_timeout_s=30.0, deadlines=Deadlines(forward_s=0.3, drain_s=0.1)
    )
    script.hold(WorkerOp.EVAL)  # a slow eval (a held-out set takes a while)
    await sup.start()
    await script.started(WorkerOp.EVAL)
    assert not sup.busy
    wedged = sup.worker
    assert wedged is not None
    script.hung.add(wedged.pid)
    stuck = asyncio.ensure_future(request(sup))
    t0 = time.monotonic()
    while sup.worker is wedged and time.monotonic() - t0 < 10:
        await asyncio.sleep(0.05)
    stuck.cancel()
    assert sup.worker is not wedged, "the watchdog never replaced the hung worker"
    assert time.monotonic() - t0 < 10  # well before eval_timeout_s = 30 s
    died = (await until_evals(sup, 1))[0]
    assert died.version == 1 and died.figures is None and died.error


@stepped
async def test_an_eval_still_running_past_its_deadline_skips_the_next_one(make: Make) -> None:
    """One eval per worker: the worker's thread runs a timed-out eval on, so the next
    version's eval in that worker is skipped and says why, until the first one ends."""
    script = Script()
    script.evals = [{"loss": 1.0}, {"loss": 0.5}, {"loss": 0.25}]
    sup = make(script, eval=SCORE, eval_timeout_s=0.2)
    script.hold(WorkerOp.EVAL)
    await sup.start()
    assert (await sup.reload("file", force=True)).ok
    timed_out, skipped = await until_evals(sup, 2)
    assert timed_out.version == 1 and "did not finish" in (timed_out.error or "")
    assert skipped.version == 2 and "eval of v1 still runs in the worker" in (skipped.error or "")
    assert [op for op in script.ops() if op == WorkerOp.EVAL] == [WorkerOp.EVAL]
    script.release(WorkerOp.EVAL)
    await sup.evals.wait()
    for _ in range(200):  # the worker's reply to v1's call ends it
        if sup.evals._call is None or sup.evals._call[2].done():
            break
        await asyncio.sleep(0.01)
    assert (await sup.reload("file", force=True)).ok
    scored = (await until_evals(sup, 3))[2]
    assert scored.version == 3 and scored.figures is not None

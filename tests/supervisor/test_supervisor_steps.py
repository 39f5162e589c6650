"""The supervisor stepped in-process, with scripted fake workers at the ops seam.

Each test holds an op, makes something happen meanwhile (another reload, a death, a stop,
a hung forward), then lets it go and checks what the supervisor did, in order. No process
is started: tests/test_reload.py and tests/test_recovery.py cover the same races with real
workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from hotreload.config import load_config
from hotreload.config.models import Deadlines
from hotreload.engine.events import EventBus
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import ModelSupervisor, PhaseFailed
from hotreload.errors import RequestTimeoutError, WorkerUnavailableError
from hotreload.protocol.messages import DigestReply, LoadReply
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.tensors import encode_tensors
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.support import make_project

Make = Callable[..., ModelSupervisor]


def stepped(body: Callable[[Make], Awaitable[None]]) -> Callable[[Path], None]:
    """Run `body(make)` in its own event loop (bounded); `make(script, **model changes)` gives
    a supervisor over fake workers, and every one made is stopped afterwards, even when the
    body fails."""

    def test(tmp_path: Path) -> None:
        config = load_config(make_project(tmp_path))

        async def main() -> None:
            made: list[ModelSupervisor] = []

            def build(script: Script, **changes: object) -> ModelSupervisor:
                model = dataclasses.replace(config.models[0], device="cpu", **changes)
                events = EventBus(None)
                sup = ModelSupervisor(
                    model,
                    config,
                    events,
                    DeviceLocks(tmp_path / "locks"),
                    spawn=lambda generation, code, standby: FakeWorker(script, generation),
                )
                sup.seen = []  # type: ignore[attr-defined]
                events.subscribe(sup.seen.append)  # type: ignore[attr-defined]
                made.append(sup)
                return sup

            try:
                await asyncio.wait_for(body(build), 60)
            finally:
                for sup in made:
                    await asyncio.wait_for(sup.stop(drain_timeout_s=0.1), 10)

        asyncio.run(main())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


def kinds(sup: ModelSupervisor, *wanted: str) -> list[str]:
    return [e.kind for e in sup.seen if e.kind in wanted]  # type: ignore[attr-defined]


def request(sup: ModelSupervisor) -> asyncio.Future:
    metas, blobs = encode_tensors({"x": np.zeros((1, 4), np.float32)})
    return sup.router.submit_future({"tensors": metas}, b"".join(bytes(b) for b in blobs))


@stepped
async def test_start_then_reload_run_the_one_build_path_in_order(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    first = script.workers[0]
    assert sup.state == "serving" and sup.version == 1 and sup.worker is first
    outcome = await sup.reload("file")
    assert outcome.ok and outcome.version == 2, outcome
    build = [WorkerOp.LOAD, WorkerOp.WARM, WorkerOp.SMOKE]
    # start: load, warm, smoke, its own swap; the inplace reload: the same build, then
    # the in-band swap and the release of the old version.
    assert script.ops(first.pid) == [
        "start",
        *build,
        WorkerOp.SWAP,
        *build,
        WorkerOp.SWAP,
        WorkerOp.RELEASE,
    ]
    assert list(outcome.phases) == [
        "load",
        "warm",
        "smoke",
        "gate",
        "drain",
        "sync",
        "swap",
        "release",
    ]
    assert (await request(sup)).header["version"] == 2


@stepped
async def test_reloads_asked_for_during_one_collapse_into_one_follow_up(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.hold(WorkerOp.LOAD)
    first = asyncio.create_task(sup.reload("file", ["a.py"]))
    await script.started(WorkerOp.LOAD)
    later = [asyncio.create_task(sup.reload(t, [f"{t}.py"])) for t in ("file", "key", "file")]
    await asyncio.sleep(0.05)
    script.release(WorkerOp.LOAD)
    a = await asyncio.wait_for(first, 10)
    rest = await asyncio.wait_for(asyncio.gather(*later), 10)
    assert a.ok and a.version == 2
    # One follow-up for the three, with every trigger and file: v3, the same outcome.
    assert {o.version for o in rest} == {3} and rest[0] is rest[1] is rest[2]
    assert rest[0].trigger == "file+key" and rest[0].detail == ["file.py", "key.py"]
    assert [o.version for o in sup.history] == [2, 3]


@stepped
async def test_a_worker_dying_during_a_reload_is_restarted_once_after_it(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    old = sup.worker
    assert isinstance(old, FakeWorker)
    script.hold(WorkerOp.WARM)
    reload = asyncio.create_task(sup.reload("file"))
    await script.started(WorkerOp.WARM)
    old.die("killed by signal 11")  # a crash in the user's forward, mid-reload
    script.release(WorkerOp.WARM)  # the restarted worker's warm-up goes through
    outcome = await asyncio.wait_for(reload, 10)
    assert not outcome.ok and outcome.phase == "warm"
    assert "was restarted with v1" in (outcome.error or ""), outcome.error
    await asyncio.sleep(0.05)  # the restart the death queued runs now: it finds v1 back
    assert sup.state == "serving" and sup.version == 1
    assert sup.worker is not old and sup.worker is script.workers[1]
    assert len(script.workers) == 2, "one restart, not a second one racing the reload"
    assert sup.record.restarts == 1
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_a_death_while_idle_queues_a_restart_on_the_same_version(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    await sup.reload("file")
    script.workers[0].die()
    for _ in range(200):
        if sup.state == "serving" and sup.worker is not script.workers[0]:
            break
        await asyncio.sleep(0.01)
    assert sup.version == 2 and sup.record.restarts == 1
    assert kinds(sup, "worker_died", "worker_restarted") == ["worker_died", "worker_restarted"]


@stepped
async def test_stop_during_a_reload_cancels_it_and_answers_every_caller(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.hold(WorkerOp.LOAD)
    running = asyncio.create_task(sup.reload("file"))
    await script.started(WorkerOp.LOAD)
    queued = asyncio.create_task(sup.reload("key"))
    restart = asyncio.create_task(sup.restart("asked"))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(sup.stop(drain_timeout_s=0.1), 10)
    a, b = await asyncio.wait_for(asyncio.gather(running, queued), 10)
    assert not a.ok and not b.ok and "stopped" in (a.error or "") and "stopped" in (b.error or "")
    with pytest.raises(WorkerUnavailableError):
        await asyncio.wait_for(restart, 10)
    assert sup.state == "stopped"
    assert all(not w.alive for w in script.workers)
    late = await sup.reload("file")
    assert not late.ok and "stopping" in (late.error or "")


@stepped
async def test_a_hung_forward_is_a_wedge_and_the_worker_is_replaced(make: Make) -> None:
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.3, drain_s=0.1))
    await sup.start()
    wedged = sup.worker
    assert wedged is not None
    script.hung.add(wedged.pid)
    stuck = request(sup)
    for _ in range(300):
        if sup.worker is not wedged and sup.state == "serving":
            break
        await asyncio.sleep(0.01)
    assert sup.worker is not wedged and sup.version == 1
    assert "kill" in script.ops(wedged.pid)
    assert kinds(sup, "wedged", "worker_restarted") == ["wedged", "worker_restarted"]
    # The hung request is not sent again (it hung the worker): its caller is told so (a
    # 504, issue 38), and the new worker serves the next ones.
    with pytest.raises(RequestTimeoutError, match="killed past its deadline"):
        await asyncio.wait_for(stuck, 10)
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_a_wedged_drain_in_a_reload_restarts_on_the_last_good_version(make: Make) -> None:
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.2, drain_s=0.2), policy="resource")
    await sup.start()
    assert sup.worker is not None
    script.hung.add(sup.worker.pid)
    stuck = request(sup)
    await asyncio.sleep(0.01)
    outcome = await asyncio.wait_for(sup.reload("file"), 10)
    assert not outcome.ok and outcome.phase == "drain", outcome
    assert "killed and restarted with v1" in (outcome.error or "")
    assert sup.version == 1 and sup.state == "serving"
    with pytest.raises(RequestTimeoutError, match="killed past its deadline"):
        await asyncio.wait_for(stuck, 10)
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_an_in_band_swap_behind_a_hung_forward_waits_forward_s_then_restarts(
    make: Make,
) -> None:
    """The in-band swap queues on the serving thread behind the requests sent before it
    (held here, as a hung forward holds it in a real worker): the drain gives up at forward_s,
    never sooner at drain_s, and the worker is restarted on the last good version. The real
    worker's side: tests/test_deadlines.py (the swap waits behind a forward longer than
    drain_s), tests/hardening/test_one_frame.py (a hung forward's request, not sent again)."""
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.4, drain_s=0.05, sync_s=0.1))
    await sup.start()
    wedged = sup.worker
    assert wedged is not None
    script.hung.add(wedged.pid)
    stuck = request(sup)
    await asyncio.sleep(0.01)
    script.hold(WorkerOp.SWAP)
    reload = asyncio.create_task(sup.reload("file"))
    await script.started(WorkerOp.SWAP)
    started = asyncio.get_running_loop().time()
    for _ in range(500):
        if kinds(sup, "wedged"):
            break
        await asyncio.sleep(0.01)
    waited = asyncio.get_running_loop().time() - started
    script.release(WorkerOp.SWAP)  # the restarted worker's own swap goes through
    outcome = await asyncio.wait_for(reload, 10)
    assert not outcome.ok and outcome.phase == "drain", outcome
    # The drain waits at least forward_s (0.4 s here), never only drain_s: then it is hung.
    assert "still running after the 0.4 s drain deadline" in (outcome.error or ""), outcome
    assert "restarted with v1" in (outcome.error or ""), outcome.error
    assert waited >= 0.4, waited
    assert "kill" in script.ops(wedged.pid)
    assert sup.worker is not wedged and sup.version == 1 and sup.state == "serving"
    assert sup.record.restarts == 1
    # Not sent again to the restarted worker (it hung the worker): its caller is told so.
    with pytest.raises(RequestTimeoutError) as told:
        await asyncio.wait_for(stuck, 10)
    assert "killed past its deadline" in str(told.value) and "not sent again" in str(told.value)
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_a_failed_build_leaves_the_old_version_serving(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.fail_next[WorkerOp.SMOKE] = {"message": "output has NaN", "type": "SmokeError"}
    outcome = await sup.reload("file")
    assert not outcome.ok and outcome.phase == "smoke" and "NaN" in (outcome.error or "")
    assert sup.version == 1 and sup.state == "serving" and sup.router.gate_open
    assert script.ops()[-1] == WorkerOp.RELEASE  # the staged version was dropped
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_a_failed_start_refuses_requests_until_a_reload_brings_it_up(make: Make) -> None:
    script = Script()
    sup = make(script)
    script.fail_next[WorkerOp.LOAD] = {"message": "no module named 'modle'", "type": "LoadError"}
    with pytest.raises(PhaseFailed) as failed:
        await sup.start()
    assert failed.value.phase == "load" and sup.state == "failed"
    with pytest.raises(WorkerUnavailableError, match="failed to start"):
        await request(sup)
    outcome = await sup.reload("file")
    assert outcome.ok and outcome.policy == "start" and outcome.version == 1
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_respawn_builds_in_the_standby_and_keeps_the_old_worker_as_the_next(
    make: Make,
) -> None:
    script = Script()
    sup = make(script, strategy="respawn", standby=True, recycle=3)
    await sup.start()
    for _ in range(200):  # the standby starts in the background after the start job
        if sup.record.standby is not None:
            break
        await asyncio.sleep(0.01)
    first, standby = script.workers
    assert sup.record.standby is standby
    outcome = await sup.reload("file")
    assert outcome.ok and sup.worker is standby and sup.version == 2
    assert sup.record.standby is first and first.alive, "the old worker is the next standby"
    assert WorkerOp.RETIRE in script.ops(first.pid)
    assert len(script.workers) == 2, "no process started for the reload"


@stepped
async def test_unload_then_reload_goes_on_from_the_last_version(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    await sup.reload("file")
    await sup.unload()
    assert sup.state == "unloaded" and sup.worker is None
    with pytest.raises(WorkerUnavailableError, match="unloaded"):
        await request(sup)
    outcome = await sup.reload("http")
    assert outcome.ok and outcome.version == 3, "a version number never names two builds"


@stepped
async def test_no_phase_is_left_showing_after_a_start_whose_digest_came_late(make: Make) -> None:
    script = Script()
    sup = make(script)
    real = script.answer

    def pending_digest(worker, request):  # type: ignore[no-untyped-def]
        reply = real(worker, request)
        if isinstance(reply, LoadReply):
            reply.digest_pending = True
        elif isinstance(reply, DigestReply):
            reply.digest = "sha256:" + "0" * 32
        return reply

    script.answer = pending_digest  # type: ignore[method-assign]
    await sup.start()
    assert WorkerOp.DIGEST in script.ops()
    assert sup.current is not None and sup.current.digest == "sha256:" + "0" * 32
    assert sup.reload_phase is None, sup.reload_phase


@stepped
async def test_a_respawn_hand_over_abandons_an_old_worker_hung_in_its_drain(make: Make) -> None:
    """The new version is built and serving; the old worker's hung forward only means the
    old worker is killed (its hung request told it was killed past its deadline), not a failed
    reload."""
    script = Script()
    sup = make(
        script, strategy="respawn", standby=False, deadlines=Deadlines(forward_s=0.3, drain_s=0.1)
    )
    await sup.start()
    old = sup.worker
    assert old is not None
    script.hung.add(old.pid)
    stuck = request(sup)
    await asyncio.sleep(0.01)
    outcome = await asyncio.wait_for(sup.reload("file"), 10)
    assert outcome.ok and outcome.version == 2, outcome
    assert sup.worker is not old and "kill" in script.ops(old.pid)
    assert any("old worker wedged in drain: abandoned" in d for d in outcome.detail), outcome
    assert kinds(sup, "wedged")[-1:] == ["wedged"]
    with pytest.raises(RequestTimeoutError, match="killed past its deadline"):
        await asyncio.wait_for(stuck, 10)
    assert (await request(sup)).header["version"] == 2

"""Where a version is built and what becomes of the old worker, stepped on fake workers.

The strategies are values (engine/model/inplace.py, respawn.py); what they learn about a
model goes into its state. These cases drive them through the port on the scripted fake:
the real processes' side of each is in tests/test_reload.py (a runtime error in a reused
standby retried in a fresh worker, a recycled worker re-importing the code, the resource
policy) and tests/test_config_reload.py (live settings).
"""

from __future__ import annotations

import asyncio
import dataclasses

from hotreload.engine.event_kinds import RecycleDisabled
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.model.settings_change import Settings
from hotreload.engine.model.supervisor import ModelSupervisor
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, request, stepped


async def _standby(sup: ModelSupervisor) -> None:
    for _ in range(500):  # the standby starts in the background after each job
        if sup.record.standby is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no standby started")


@stepped
async def test_a_failed_import_in_a_reused_worker_builds_fresh_and_stops_reuse(make: Make) -> None:
    """Code with a one-time effect per process fails its second import: the build is tried
    once in a fresh worker, the model's workers are no longer reused (said once), and the
    old worker is stopped rather than kept."""
    script = Script()
    sup = make(script, strategy="respawn", standby=True, recycle=3)
    await sup.start()
    await _standby(sup)
    assert (await sup.reload("file")).ok  # the first worker is kept: the next standby
    reused = sup.record.standby
    assert reused is not None and reused.recycled == 1
    serving = sup.worker
    script.fail_next[WorkerOp.LOAD] = {"message": "op already registered", "type": "RuntimeError"}
    outcome = await sup.reload("file")
    assert outcome.ok and outcome.version == 3, outcome
    assert any("no longer reused" in d for d in outcome.detail), outcome.detail
    assert sup.worker not in (reused, serving), "built in a fresh process"
    assert sup.record.recycle_off is not None
    assert serving is not None and not serving.alive, "the old worker was stopped, not kept"
    assert "stop" in script.ops(serving.pid) and WorkerOp.RETIRE not in script.ops(serving.pid)
    await _standby(sup)  # a fresh standby instead
    assert (await sup.reload("file")).ok
    told = [e for e in sup.seen if isinstance(e, RecycleDisabled)]  # type: ignore[attr-defined]
    assert len(told) == 1 and "second import" in told[0].reason
    assert (await request(sup)).header["version"] == 4


@stepped
async def test_a_deterministic_error_in_a_reused_worker_is_not_retried(make: Make) -> None:
    """A syntax error comes out the same in any process: no fresh worker, reuse stays on."""
    script = Script()
    sup = make(script, strategy="respawn", standby=True, recycle=3)
    await sup.start()
    await _standby(sup)
    assert (await sup.reload("file")).ok
    spawned = len(script.workers)
    script.fail_next[WorkerOp.LOAD] = {"message": "invalid syntax", "type": "SyntaxError"}
    outcome = await sup.reload("file")
    assert not outcome.ok and outcome.phase == "load" and sup.version == 2
    assert len(script.workers) == spawned and sup.record.recycle_off is None


@stepped
async def test_the_resource_policy_restores_the_offloaded_version_after_a_failed_build(
    make: Make,
) -> None:
    script = Script()
    sup = make(script, policy="resource")
    await sup.start()
    worker = sup.worker
    assert worker is not None
    script.fail_next[WorkerOp.SMOKE] = {"message": "output has NaN", "type": "SmokeError"}
    outcome = await sup.reload("file")
    assert not outcome.ok and outcome.phase == "smoke" and outcome.policy == "resource"
    ops = script.ops(worker.pid)
    assert ops.index(WorkerOp.OFFLOAD) < ops.index(WorkerOp.LOAD, 5) < ops.index(WorkerOp.RESTORE)
    assert sup.worker is worker and sup.version == 1 and sup.router.gate_open
    assert (await request(sup)).header["version"] == 1


@stepped
async def test_live_settings_reach_the_router_and_the_next_spawn_at_once(make: Make) -> None:
    """A setting read each time it is used (the queue limit) applies through the model's
    state, with no build; the settings a reload builds with are the same object."""
    script = Script()
    sup = make(script)
    await sup.start()
    new = dataclasses.replace(sup.model, max_queue_size=3, request_timeout_s=7.0)
    sup.use_settings(Settings(new, IgnoreRules()))
    assert sup.model is new and sup.workers.model is new and sup.st.model is new
    assert (sup.router.max_queue_size, sup.router.request_timeout_s) == (3, 7.0)
    assert script.ops()[-1] == WorkerOp.SWAP, "nothing was built"
    assert (await sup.reload("file")).ok and sup.model is new


def _spawn_details(sup: ModelSupervisor) -> list[str]:
    """The detail of each spawn phase, in order: where the build's worker came from."""
    seen = sup.seen  # type: ignore[attr-defined]
    return [str(e.detail) for e in seen if e.kind == "phase_end" and e.phase == "spawn"]


@stepped
async def test_recycle_0_builds_in_a_standby_started_ahead_and_a_new_one_follows_each_reload(
    make: Make,
) -> None:
    """`recycle = 0`: each version is built in a standby started ahead of time, a new one
    starts after each reload, and the worker that served is stopped, never kept. With real
    processes: tests/test_reload.py, `test_respawn_builds_in_a_standby_worker` (a recycled
    standby's status; with no standby, each retired worker's process ends)."""
    script = Script()
    sup = make(script, strategy="respawn", standby=True, recycle=0)
    await sup.start()
    for version in (2, 3):
        await _standby(sup)
        serving, standby = sup.worker, sup.record.standby
        assert serving is not None and standby is not None
        outcome = await sup.reload("file")
        assert outcome.ok and outcome.version == version, outcome
        assert sup.worker is standby, "the standby built the version and serves it"
        assert "started ahead of time" in _spawn_details(sup)[-1]
        assert not serving.alive and "stop" in script.ops(serving.pid), "the old worker stopped"
        assert WorkerOp.RETIRE not in script.ops(serving.pid), "not kept as the next standby"
        await _standby(sup)
        assert sup.record.standby not in (serving, standby)
        assert sup.record.standby.recycled == 0
    ready = [e for e in sup.seen if e.kind == "standby_ready"]  # type: ignore[attr-defined]
    assert len(ready) == 3 and not any(e.recycled for e in ready)
    assert (await request(sup)).header["version"] == 3


@stepped
async def test_without_a_standby_each_reload_spawns_its_worker_and_stops_the_old(
    make: Make,
) -> None:
    """`standby = false`: nothing is started ahead; each reload spawns the worker it builds
    in, and the one that served is stopped (its real process ends: tests/test_reload.py)."""
    script = Script()
    sup = make(script, strategy="respawn", standby=False)
    await sup.start()
    for version in (2, 3):
        serving, spawned = sup.worker, len(script.workers)
        assert serving is not None
        outcome = await sup.reload("file")
        assert outcome.ok and outcome.version == version, outcome
        assert len(script.workers) == spawned + 1 and sup.worker is script.workers[-1]
        assert "ahead" not in _spawn_details(sup)[-1]
        assert not serving.alive and "stop" in script.ops(serving.pid)
        assert sup.record.standby is None
    assert not [e for e in sup.seen if e.kind == "standby_ready"]  # type: ignore[attr-defined]
    assert (await request(sup)).header["version"] == 3

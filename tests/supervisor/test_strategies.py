"""Where a version is built and what becomes of the old worker, stepped on fake workers.

The strategies are values (engine/model/inplace.py, respawn.py); what they learn about a
model goes into its state. These cases drive them through the port on the scripted fake:
the real processes' side of each is in tests/test_reload.py (a fresh worker after a second
import fails, the resource policy) and tests/test_config_reload.py (live settings).
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

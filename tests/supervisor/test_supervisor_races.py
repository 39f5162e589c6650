"""Races between reloads and worker deaths, stepped on fake workers (tests/supervisor/
fake_worker.py): the engine's side of tests/test_recovery.py, which runs them with real
worker processes and a second of timing each. Here each race is held exactly where it
happens, so it is the same race on every run, whatever the machine's load.
"""

from __future__ import annotations

import asyncio

from hotreload.errors import WorkerUnavailableError
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, kinds, request, stepped


@stepped
async def test_a_reload_asked_for_while_the_worker_restarts_waits_and_leaves_one_worker(
    make: Make,
) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    first = script.workers[0]
    script.hold("start")  # the restarted worker's start waits until the reload is queued
    first.die()
    await script.started("start")
    assert sup.state == "restarting"
    reload = asyncio.create_task(sup.reload("http"))
    await asyncio.sleep(0.05)
    assert len(script.workers) == 2, "the reload waits for the restart, starting nothing"
    script.release("start")
    outcome = await asyncio.wait_for(reload, 10)
    assert outcome.ok and outcome.version == 2, outcome
    second = script.workers[1]
    assert sup.state == "serving" and sup.worker is second and sup.record.restarts == 1
    assert len(script.workers) == 2, "one worker: the reload built in the restarted one"
    assert WorkerOp.LOAD in script.ops(second.pid)[-6:], "v2 was built in the restarted worker"
    assert (await request(sup)).header["version"] == 2


@stepped
async def test_a_death_in_a_resource_reload_restarts_on_the_last_version_naming_the_phase(
    make: Make,
) -> None:
    """policy = "resource" offloads the serving version before the new one loads: the worker
    dying in that load leaves nothing serving until it is restarted with v1."""
    script = Script()
    sup = make(script, policy="resource")
    await sup.start()
    first = script.workers[0]
    script.hold(WorkerOp.LOAD)
    reload = asyncio.create_task(sup.reload("file"))
    await script.started(WorkerOp.LOAD)
    assert WorkerOp.OFFLOAD in script.ops(first.pid), "v1 was offloaded before the load"
    first.die("exit code 3")  # the new code ends the process as it is imported
    script.release(WorkerOp.LOAD)  # the restarted worker loads v1 again
    outcome = await asyncio.wait_for(reload, 10)
    assert not outcome.ok and outcome.phase == "load", outcome
    assert "worker died" in (outcome.error or "") and "restarted with v1" in (outcome.error or "")
    assert sup.state == "serving" and sup.version == 1 and sup.worker is script.workers[1]
    assert len(script.workers) == 2 and sup.record.restarts == 1
    assert (await request(sup)).header["version"] == 1
    # The next good save goes live as usual, in the restarted worker.
    fixed = await sup.reload("file")
    assert fixed.ok and fixed.version == 2 and sup.worker is script.workers[1]
    assert (await request(sup)).header["version"] == 2


@stepped
async def test_the_old_worker_dying_while_a_respawn_builds_lets_the_new_one_take_over(
    make: Make,
) -> None:
    """The new worker is built when the old one dies: it takes over, rather than being thrown
    away for a restart of the old version."""
    script = Script()
    sup = make(script, strategy="respawn", standby=False)
    await sup.start()
    old = script.workers[0]
    script.hold(WorkerOp.LOAD)
    reload = asyncio.create_task(sup.reload("file"))
    await script.started(WorkerOp.LOAD)
    new = script.workers[1]
    assert script.ops(new.pid)[-1] == WorkerOp.LOAD, "the build runs in a new worker"
    old.die()
    await asyncio.sleep(0.05)
    script.release(WorkerOp.LOAD)
    outcome = await asyncio.wait_for(reload, 10)
    assert outcome.ok and outcome.version == 2, outcome
    await asyncio.sleep(0.05)  # a restart the death queued would run now
    assert sup.state == "serving" and sup.worker is new and new.alive
    assert len(script.workers) == 2, "no worker started for the old one's death"
    assert kinds(sup, "worker_restarted") == []
    assert (await request(sup)).header["version"] == 2


@stepped
async def test_a_worker_dying_under_load_fails_only_its_own_request_and_serves_the_rest(
    make: Make,
) -> None:
    """A worker killed under load: the request it was computing fails at once (it may be what
    killed it: not sent again), the ones queued behind it are served by the worker restarted
    on the same version, and no request hangs."""
    script = Script()
    sup = make(script)
    await sup.start()
    first = script.workers[0]
    script.hung.add(first.pid)  # its forwards stay in flight until it dies
    held = [request(sup) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert not any(f.done() for f in held)
    first.die()
    _, pending = await asyncio.wait(held, timeout=10)
    assert not pending, "a request on the dead worker hangs"
    failed = [f.exception() for f in held if f.exception() is not None]
    assert len(failed) == 1 and isinstance(failed[0], WorkerUnavailableError), failed
    assert "died while computing this request" in str(failed[0])
    assert held[0].exception() is failed[0], "the one sent first was the one computing"
    assert {f.result().header["version"] for f in held[1:]} == {1}
    assert sup.worker is script.workers[1] and sup.record.restarts == 1 and sup.version == 1
    assert len(script.workers) == 2

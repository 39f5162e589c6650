"""A reload with new settings (settings_change.py), stepped with scripted fake workers: it
builds in a fresh worker with them, and when it fails, everything comes back as it was,
including a worker restarted during the build; a file reload never shares its fate."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hotreload.config import load_config
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import ModelSupervisor
from hotreload.engine.model.settings_change import Settings
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.support import make_project

BAD = {"message": "bad new settings", "code": "model_error"}


class Harness:
    """A supervisor over fake workers; `spawned` is each worker's (pid, env it was
    started with)."""

    def __init__(self, tmp_path: Path, **changes: Any) -> None:
        config = load_config(make_project(tmp_path))
        self.model = dataclasses.replace(config.models[0], device="cpu", **changes)
        self.script = Script()
        self.spawned: list[tuple[int, dict[str, str]]] = []

        def spawn(generation: int, code: Any, *, standby: bool) -> FakeWorker:
            worker = FakeWorker(self.script, generation)
            self.spawned.append((worker.pid, dict(self.sup.model.env)))
            return worker

        locks = DeviceLocks(tmp_path / "locks")
        self.sup = ModelSupervisor(self.model, config, EventBus(None), locks, spawn=spawn)

    def settings(self, **changes: Any) -> Settings:
        return Settings(dataclasses.replace(self.model, **changes), IgnoreRules())

    def env_of(self, pid: int | None) -> dict[str, str]:
        return next(env for p, env in self.spawned if p == pid)


def stepped(body: Callable[[Harness], Awaitable[None]]) -> Callable[[Path], None]:
    def test(tmp_path: Path) -> None:
        async def main() -> None:
            h = Harness(tmp_path)
            try:
                await h.sup.start()
                await asyncio.wait_for(body(h), 60)
            finally:
                await asyncio.wait_for(h.sup.stop(drain_timeout_s=0.1), 10)

        asyncio.run(main())

    test.__name__ = body.__name__
    return test


@stepped
async def test_new_settings_build_in_a_fresh_worker_and_stay(h: Harness) -> None:
    first = h.sup.record.serving
    out = await h.sup.reload("config", ["hotreload.toml: env"], settings=h.settings(env={"A": "1"}))
    assert out.ok and out.version == 2, out
    serving = h.sup.record.serving
    assert serving is not first and not first.alive
    assert h.env_of(serving.pid) == {"A": "1"} and h.sup.model.env == {"A": "1"}


@stepped
async def test_failed_settings_put_the_old_ones_back(h: Harness) -> None:
    first, before = h.sup.record.serving, h.sup.model
    h.script.fail_next[WorkerOp.LOAD] = BAD
    out = await h.sup.reload("config", ["x"], settings=h.settings(env={"A": "1"}, max_queue_size=7))
    assert not out.ok and "bad new settings" in str(out.error)
    assert h.sup.record.serving is first and first.alive and out.version == 1
    assert h.sup.model is before and h.sup.workers.model is before and h.sup.st.model is before
    assert h.sup.router.max_queue_size == before.max_queue_size


@stepped
async def test_a_worker_restarted_during_failed_settings_comes_back_with_the_old_ones(
    h: Harness,
) -> None:
    h.script.hold(WorkerOp.LOAD)
    job = asyncio.create_task(h.sup.reload("config", ["x"], settings=h.settings(env={"NEW": "1"})))
    await h.script.started(WorkerOp.LOAD)
    h.sup.record.serving.die("oom")  # the serving worker dies while the new one builds
    h.script.fail_next[WorkerOp.LOAD] = BAD
    h.script.release(WorkerOp.LOAD)
    out = await job
    assert not out.ok
    restarted = h.sup.record.serving
    assert restarted is not None and restarted.alive
    assert h.env_of(restarted.pid) == dict(h.model.env), "restarted with the old settings"
    assert h.sup.model is h.model


@stepped
async def test_a_file_reload_queued_behind_failed_settings_still_runs(h: Harness) -> None:
    h.script.hold(WorkerOp.LOAD)
    running = asyncio.create_task(h.sup.reload("file", ["model.py"], force=True))
    await h.script.started(WorkerOp.LOAD)
    config = asyncio.create_task(h.sup.reload("config", ["x"], settings=h.settings(env={"A": "1"})))
    await asyncio.sleep(0.05)
    again = asyncio.create_task(h.sup.reload("file", ["model.py"], force=True))
    await asyncio.sleep(0.05)
    first = h.script._holds[WorkerOp.LOAD]
    h.script.hold(WorkerOp.LOAD)  # the config reload's LOAD waits next
    first.set()
    assert (await running).ok
    await h.script.started(WorkerOp.LOAD)
    h.script.fail_next[WorkerOp.LOAD] = BAD
    h.script.release(WorkerOp.LOAD)
    failed, rerun = await config, await again
    assert not failed.ok and failed.trigger == "config"
    assert rerun.ok and rerun.trigger == "file" and rerun.version == 3, rerun
    assert h.env_of(h.sup.record.serving.pid) == dict(h.model.env)


@stepped
async def test_a_live_edit_made_while_new_settings_build_outlives_their_failure(
    h: Harness,
) -> None:
    """The file was saved again during the trial with a live setting: it says that now,
    so a failed trial does not put the settings from before it back."""
    h.script.hold(WorkerOp.LOAD)
    job = asyncio.create_task(h.sup.reload("config", ["x"], settings=h.settings(env={"A": "1"})))
    await h.script.started(WorkerOp.LOAD)
    live = dataclasses.replace(h.model, max_inflight=3)
    h.sup.use_settings(Settings(live, IgnoreRules()))
    h.script.fail_next[WorkerOp.LOAD] = BAD
    h.script.release(WorkerOp.LOAD)
    assert not (await job).ok
    assert h.sup.model is live and h.sup.router.max_inflight == 3

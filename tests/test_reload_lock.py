"""The reload lock (issue 38, item 13): CPU reloads of unrelated sessions do not wait on each
other, "unchanged" is decided before any lock, and a wait past a second is said at once with
who holds the lock: in the events, the dashboard's toast, `hotreload reload` and `check`."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from hotreload.engine.event_kinds import LockWait
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import unchanged
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, kinds, stepped
from tests.support import ServeProcess, count_events, make_project, wait_until


def test_cpu_reloads_of_two_sessions_do_not_wait_for_each_other(tmp_path: Path) -> None:
    folder = tmp_path / "locks"

    async def main() -> float:
        one, two = DeviceLocks(folder, config="/a/hotreload.toml"), DeviceLocks(folder)
        async with one.hold("cpu", model="a"), two.hold("cpu", model="b") as waited:
            return waited

    assert asyncio.run(asyncio.wait_for(main(), 10)) == 0.0


def test_a_gpu_lock_wait_is_said_at_once_naming_pid_model_and_config(tmp_path: Path) -> None:
    folder = tmp_path / "locks"
    said: list[tuple[float, str]] = []

    async def main() -> tuple[float, float]:
        one = DeviceLocks(folder, poll_s=0.01, config="/proj/a/hotreload.toml")
        two = DeviceLocks(folder, poll_s=0.01, tell_after_s=0.2)
        released = asyncio.Event()

        async def holder() -> None:
            async with one.hold("cuda:0", model="bert"):
                await asyncio.sleep(1.5)
            released.set()

        held = asyncio.create_task(holder())
        await asyncio.sleep(0.1)
        async with two.hold("cuda:0", on_wait=lambda line: said.append((time.monotonic(), line))):
            done = time.monotonic()
            assert released.is_set()
        await held
        return done, said[0][0] if said else float("inf")

    done, told_at = asyncio.run(asyncio.wait_for(main(), 20))
    assert len(said) == 1, said
    assert told_at < done, "said while the other session still held the lock, not after"
    line = said[0][1]
    assert "cuda:0" in line and "model 'bert'" in line, line
    assert "config /proj/a/hotreload.toml" in line and "pid " in line, line


@stepped
async def test_an_unchanged_reload_answers_while_another_holds_the_lock(make: Make) -> None:
    sup = make(Script())
    await sup.start()

    async def same(outcome: Any, *args: Any) -> None:
        # The fake worker reports no imported files, so no snapshot to compare: say "the
        # same" here; the real comparison is the end-to-end test below.
        outcome.unchanged = True

    with mock.patch.object(unchanged, "check", same):
        async with sup.locks.hold("cpu", model="other"):
            outcome = await asyncio.wait_for(sup.reload("command"), 5)
    assert outcome.ok and outcome.unchanged, outcome
    assert "lock" not in outcome.phases


@stepped
async def test_a_build_waiting_for_the_lock_emits_who_holds_it_before_it_ends(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    sup.locks.tell_after_s = 0.1
    async with sup.locks.hold("cpu", model="other"):
        reload = asyncio.create_task(sup.reload("command", force=True))
        for _ in range(200):
            if kinds(sup, "lock_wait"):
                break
            await asyncio.sleep(0.01)
        assert not reload.done()
        waits = [e for e in sup.seen if isinstance(e, LockWait)]  # type: ignore[attr-defined]
        assert len(waits) == 1 and "held by pid" in waits[0].message, waits
        assert "model 'other'" in waits[0].message
    outcome = await asyncio.wait_for(reload, 10)
    assert outcome.ok and outcome.version == 2 and outcome.phases["lock"] > 0
    assert WorkerOp.LOAD in script.ops(script.workers[0].pid)


TWO_MODELS = """
[[models]]
name = "a"
entry = "a/a.py:build"
example = "a/a.py:example_input"
device = "cpu"
threads = 1
watch = ["a/sleep_a.txt"]

[[models]]
name = "b"
entry = "b/model.py:build"
example = "b/model.py:example_input"
device = "cpu"
threads = 1

[watch]
quiet_ms = 50
"""

SLOW_A = """
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def build():
    # "hold": the build holds the CPU reload lock until the test writes `go` (60 s at most).
    if (HERE / "sleep_a.txt").read_text().strip() == "hold":
        deadline = time.monotonic() + 60
        while not (HERE / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return torch.nn.Linear(4, 2)


def example_input():
    return torch.zeros(1, 4)
"""


def test_hotreload_reload_says_who_holds_the_lock_and_unchanged_does_not_wait(
    tmp_path: Path, serve: ServeProcess.Factory
) -> None:
    # Each model in a folder of its own: a file saved in a's folder is not in b's snapshot.
    config = make_project(tmp_path, config=TWO_MODELS)
    a = config.parent / "a"
    a.mkdir()
    (a / "a.py").write_text(SLOW_A)
    (a / "sleep_a.txt").write_text("0")
    (config.parent / "b").mkdir()
    shutil.copy(config.parent / "model.py", config.parent / "b" / "model.py")
    serve(config, "--no-tui", command="watch", wait_ready=False)
    wait_until(lambda: count_events(config, "ready") >= 2, 90, what="both models ready")
    (a / "sleep_a.txt").write_text("hold")  # a's reload builds, holding the lock until `go`
    wait_until(
        lambda: count_events(config, "phase_start", model="a", phase="load"), 30, what="a loads"
    )
    cmd = [sys.executable, "-m", "hotreload", "reload", "b", "--config", str(config)]
    try:
        same = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert same.returncode == 0 and "unchanged" in same.stdout, same
        assert count_events(config, "reload_done", model="a") == 0, "answered before a's build"
        forced = subprocess.Popen(
            [*cmd, "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert forced.stderr is not None
            line = forced.stderr.readline()  # said while a still holds the lock
            assert "waiting for the cpu reload lock, held by pid" in line, line
            assert "model 'a'" in line and str(config) in line, line
            assert count_events(config, "reload_done", model="a") == 0
            (a / "go").write_text("")
            out, err = forced.communicate(timeout=60)
        finally:
            if forced.poll() is None:
                forced.kill()
                forced.wait(10)
        assert forced.returncode == 0, err
        assert "reloaded -> v2" in out, out
    finally:
        (a / "go").write_text("")  # whatever failed, a's build ends

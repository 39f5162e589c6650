"""Races between reloads, restarts and shutdown: real worker processes, the example on CPU."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psutil

from hotreload import Client
from hotreload.config import load_config
from hotreload.engine.model import ReloadOutcome
from hotreload.engine.session import Session
from tests.support import ServeProcess, make_project, read_events, wait_until

X = np.random.default_rng(5).standard_normal((1, 64), dtype=np.float32)


def live_workers(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def set_policy(config: Path, policy: str, strategy: str = "inplace") -> None:
    text = config.read_text().replace('policy = "auto"', f'policy = "{policy}"')
    config.write_text(text.replace('strategy = "inplace"', f'strategy = "{strategy}"'))


def assert_one_worker_serves_v2(
    session: ServeProcess, client: Client, pid: int, expected: np.ndarray
) -> None:
    """Worker `pid` is the only one left, and v2 answers as v1 did."""
    wait_until(
        lambda: live_workers(session.worker_pids()) == [pid],
        30,
        what=f"only worker {pid} (have {session.worker_pids()})",
    )
    out, version, _ = client.infer("mlp", X)
    assert version == 2
    np.testing.assert_array_equal(out, expected)


def test_reload_asked_for_while_the_worker_restarts_leaves_one_worker(project: Path, serve) -> None:
    session = serve(project)
    client = Client(config=project, timeout_s=120)
    expected = client.infer("mlp", X).output
    os.kill(client.status()["models"][0]["pid"], signal.SIGKILL)
    wait_until(lambda: client.status()["models"][0]["state"] == "restarting", 30, what="restarting")
    outcome = client.reload("mlp", force=True)["outcomes"][0]
    assert outcome["ok"] is True and outcome["version"] == 2
    status = client.status()["models"][0]
    assert status["state"] == "serving" and status["restarts"] == 1
    # One worker: the reload waited for the restart instead of starting a second one.
    assert_one_worker_serves_v2(session, client, status["pid"], expected)


def test_worker_dying_in_a_resource_reload_is_restarted_and_the_reload_names_the_phase(
    project: Path, serve
) -> None:
    set_policy(project, "resource")
    session = serve(project, "--no-tui", command="watch")
    client = Client(config=project, timeout_s=120)
    expected = client.infer("mlp", X).output
    model = project.parent / "model.py"
    good = model.read_text()
    # The old version is offloaded first (resource), then the new code kills the process.
    model.write_text(good + "\nimport os\nos._exit(3)\n")
    wait_until(
        lambda: any(e["kind"] == "reload_failed" for e in read_events(project)),
        60,
        what="the failed reload",
    )
    failed = next(e for e in read_events(project) if e["kind"] == "reload_failed")
    assert failed["phase"] == "load", failed
    assert "worker died" in failed["error"] and "restarted with v1" in failed["error"], failed
    status = client.status()["models"][0]
    assert status["state"] == "serving" and status["version"] == 1
    out, version, _ = client.infer("mlp", X)
    assert version == 1
    np.testing.assert_array_equal(out, expected)
    assert len(live_workers(session.worker_pids())) == 1
    # The next good save goes live as usual.
    model.write_text(good.replace("SCALE = 1.0", "SCALE = 2.0"))
    wait_until(lambda: client.status()["models"][0]["version"] == 2, 60, what="v2")
    np.testing.assert_allclose(client.infer("mlp", X).output, expected * 2, rtol=1e-5)


SLOW_WHEN_MARKED = """
import pathlib
import time

import model_base

MARK = pathlib.Path(__file__).with_name("slow.mark")


def build():
    if MARK.exists():
        MARK.write_text("loading")
        time.sleep(4)
    return model_base.build()


example_input = model_base.example_input
"""


def slow_respawn_project(tmp_path: Path) -> Path:
    config = make_project(tmp_path)
    folder = config.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(SLOW_WHEN_MARKED)
    set_policy(config, "availability", "respawn")
    # A fresh spawn per reload: these tests count worker processes (the standby has its own).
    config.write_text(
        config.read_text().replace('strategy = "respawn"', 'strategy = "respawn"\nstandby = false')
    )
    return config


def test_old_worker_dying_while_a_respawn_builds_the_new_one(tmp_path: Path, serve) -> None:
    config = slow_respawn_project(tmp_path)
    session = serve(config)
    client = Client(config=config, timeout_s=120)
    expected = client.infer("mlp", X).output
    old_pid = client.status()["models"][0]["pid"]
    mark = config.parent / "slow.mark"
    mark.write_text("")
    outcomes: list[dict] = []
    t = threading.Thread(
        target=lambda: outcomes.append(
            Client(config=config, timeout_s=120).reload("mlp", force=True)
        )
    )
    t.start()
    wait_until(lambda: mark.read_text() == "loading", 60, what="the new worker loading")
    os.kill(old_pid, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive()
    outcome = outcomes[0]["outcomes"][0]
    # The new worker was ready: it takes over instead of being thrown away with the old one.
    assert outcome["ok"] is True and outcome["version"] == 2, outcome
    status = client.status()["models"][0]
    assert status["pid"] != old_pid and status["state"] == "serving"
    assert_one_worker_serves_v2(session, client, status["pid"], expected)


def test_stop_during_a_reload_answers_every_waiting_caller(tmp_path: Path) -> None:
    config_path = slow_respawn_project(tmp_path)
    (config_path.parent / "slow.mark").write_text("")
    config = load_config(config_path)

    async def scenario() -> tuple[ReloadOutcome, ReloadOutcome, ReloadOutcome]:
        session = Session(config, endpoint=False, telemetry=False)
        try:
            await session.start()
            first = asyncio.create_task(session.reload_model("mlp", force=True))
            while session.models["mlp"].reload_phase != "load":
                await asyncio.sleep(0.01)
            follow_up = asyncio.create_task(session.reload_model("mlp", force=True))
            await asyncio.sleep(0)
        finally:
            await session.stop()
        late = await session.reload_model("mlp", force=True)
        return await first, await follow_up, late

    first, follow_up, late = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert not first.ok and "stopped before the reload finished" in (first.error or "")
    assert not follow_up.ok and "stopped before the reload finished" in (follow_up.error or "")
    assert not late.ok and "the session is stopping" in (late.error or "")


LAYERS = "FACTOR = 1.0\n"
MODEL_WITH_LAYERS = """
import model_base
from layers import FACTOR


def build():
    m = model_base.build()
    forward = m.forward
    m.forward = lambda x: forward(x) * FACTOR
    return m


example_input = model_base.example_input
"""


def test_reload_after_a_restart_reads_edited_sibling_modules(tmp_path: Path, serve) -> None:
    config = make_project(tmp_path)
    folder = config.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(MODEL_WITH_LAYERS)
    (folder / "layers.py").write_text(LAYERS)
    session = serve(config, "--no-tui", command="watch")
    client = Client(config=config, timeout_s=120)
    expected = client.infer("mlp", X).output
    os.kill(client.status()["models"][0]["pid"], signal.SIGKILL)
    wait_until(lambda: "worker restarted" in session.output, 60, what="restart")
    assert client.infer("mlp", X).version == 1
    # The restarted worker loaded v1 from the last good snapshot; the next edit is live code.
    (folder / "layers.py").write_text("FACTOR = 3.0\n")
    wait_until(lambda: client.status()["models"][0]["version"] == 2, 60, what="v2")
    out, version, _ = client.infer("mlp", X)
    assert version == 2
    np.testing.assert_allclose(out, expected * 3, rtol=1e-5)


def test_check_reports_a_model_failing_on_zeros_as_a_failed_step(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    model.write_text(
        model.read_text()
        + "\n_forward = MLP.forward\n\n\ndef _checked(self, x):\n"
        + "    if not x.any():\n        raise ValueError('all-zero input refused')\n"
        + "    return _forward(self, x)\n\n\nMLP.forward = _checked\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "hotreload", "check", "--config", str(config), "--reloads", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(config.parent),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL infer" in result.stdout and "all-zero input refused" in result.stdout

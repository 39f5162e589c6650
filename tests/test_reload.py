"""`hotreload watch` end to end: real files, real worker processes, the example on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from hotreload import Client
from hotreload.commands.status import format_status
from hotreload.errors import WorkerUnavailableError
from tests.support import Traffic, count_events, make_project, read_events, wait_until

X = np.random.default_rng(3).standard_normal((1, 64), dtype=np.float32)


def reloaded(client: Client) -> dict:
    """Reload the model, a build even when no file changed (`force`: these tests exercise
    the build; tests/hardening/test_unchanged_reload.py the no-op); the outcome, which
    must be a success."""
    outcome = client.reload("mlp", force=True)["outcomes"][0]
    assert outcome["ok"], outcome
    return outcome


def set_scale(config: Path, value: float) -> None:
    path = config.parent / "model.py"
    text = path.read_text()
    start = text.index("SCALE = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + f"SCALE = {value}" + text[end:])


def wait_version(client: Client, version: int, timeout: float = 30.0) -> None:
    wait_until(
        lambda: client.status()["models"][0]["version"] >= version,
        timeout,
        what=f"version {version}",
    )


def wait_outcomes(config: Path, n: int, timeout: float = 30.0) -> None:
    def done() -> bool:
        return count_events(config, "reload_done") + count_events(config, "reload_failed") >= n

    wait_until(done, timeout, what=f"{n} reload outcome(s)")


def test_a_build_pauses_for_requests_being_served_and_never_on_an_idle_model(
    project: Path, serve
) -> None:
    # A forward of 4 ms or more keeps the serving thread busy through every warm-up pass
    # while the 4 clients send (the example's ~1 ms one left a pass idle on a loaded
    # machine now and then, and a pass with requests waiting was not paused).
    code = project.parent / "model.py"
    code.write_text(
        code.read_text()
        + "\n\nimport time as _time\n_fast = MLP.forward\n\n\n"
        + "def _slow(self, x):\n    _time.sleep(0.004)\n    return _fast(self, x)\n\n\n"
        + "MLP.forward = _slow\n"
    )
    serve(project)
    client = Client(config=project, timeout_s=60)
    assert reloaded(client)
    traffic = Traffic(project)
    try:
        wait_until(lambda: len(traffic.results) > 20, 30, what="steady traffic")
        assert reloaded(client)
    finally:
        traffic.stop()
    assert traffic.failures == []
    ends = [e for e in read_events(project) if e["kind"] == "phase_end"]
    warm = [e for e in ends if e["phase"] == "warm"]
    assert len(warm) == 2, warm
    # Idle: full speed. Under traffic: each warm-up pass is followed by a pause.
    assert "paused" not in warm[0]["detail"], warm[0]
    assert "for requests being served" in warm[1]["detail"], warm[1]


BREAKAGES = {
    "syntax error": ("def build(:\n", "SyntaxError"),
    "factory raises": (
        "def build():\n    raise RuntimeError('factory refuses')\n",
        "factory refuses",
    ),
    "NaN output": ("SCALE = float('nan')\n", "non-finite"),
    "changed shape": (
        "_forward = MLP.forward\nMLP.forward = lambda self, x: _forward(self, x)[:, :5]\n",
        "output changed from output float32[1, 10] to output float32[1, 5]",
    ),
}


def test_edits_go_live_without_failed_requests_and_broken_ones_leave_the_last_good_serving(
    project: Path, serve
) -> None:
    """One watch session: a code edit then a weights save go live under traffic, none of its
    requests failing; then each broken edit leaves v3 serving, the next good save works,
    and `hotreload reload` exits 0 / 1 as documented."""
    session = serve(project, "--no-tui", command="watch")
    client = Client(config=project)
    traffic = Traffic(project)
    try:
        wait_until(lambda: len(traffic.results) > 20, 30, what="steady traffic")
        set_scale(project, 2.0)
        wait_version(client, 2)
        subprocess.run(
            [sys.executable, str(project.parent / "make_weights.py"), "--seed", "7"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_version(client, 3)
        n = len(traffic.results)
        wait_until(lambda: len(traffic.results) > n + 20, 30, what="traffic on v3")
    finally:
        traffic.stop()
    assert traffic.failures == []
    by_version = {v: out for v, out in traffic.results}
    assert set(by_version) == {1, 2, 3}
    np.testing.assert_allclose(by_version[2], by_version[1] * 2, rtol=1e-5)
    assert not np.allclose(by_version[3], by_version[2]), "new weights change the output"
    events = read_events(project)
    done = [e for e in events if e["kind"] == "reload_done"]
    assert [e["version"] for e in done] == [2, 3]
    weights_load = [e for e in events if e["kind"] == "phase_end" and e["phase"] == "load"][-1]
    assert "weights only" in weights_load["detail"]
    assert done[0]["trigger"] == "file" and set(done[0]["phases"]) >= {"load", "warm", "swap"}

    # Broken edits, each in turn: v3 serves on.
    model = project.parent / "model.py"
    good = model.read_text()
    expected = client.infer("mlp", X).output
    for n, (name, (line, message)) in enumerate(BREAKAGES.items(), start=1):
        model.write_text(good + "\n" + line)
        wait_outcomes(project, 2 + n)
        failed = [e for e in read_events(project) if e["kind"] == "reload_failed"]
        assert len(failed) == n, name
        assert message in failed[-1]["error"] + (failed[-1].get("traceback") or ""), name
        out, version, _ = client.infer("mlp", X)
        assert version == 3, name
        np.testing.assert_array_equal(out, expected)
    assert "reload FAILED" in session.output and "v3 keeps serving" in session.output
    # The next good save works, and `hotreload reload` exits 0 / 1 as documented.
    model.write_text(good.replace("SCALE = 2.0", "SCALE = 6.0"))
    wait_version(client, 4)
    np.testing.assert_allclose(client.infer("mlp", X).output, expected * 3, rtol=1e-5)
    cmd = [sys.executable, "-m", "hotreload", "reload", "--config", str(project)]
    same = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and "unchanged: nothing to reload" in same.stdout, same.stdout
    ok = subprocess.run([*cmd, "--force"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "reloaded -> v5" in ok.stdout
    model.write_text(model.read_text() + "\ndef build():\n    raise ValueError('nope')\n")
    wait_outcomes(project, 2 + len(BREAKAGES) + 4)
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (
        bad.returncode == 1 and "FAILED in load" in bad.stdout and "v5 keeps serving" in bad.stdout
    )


def test_the_watcher_reloads_once_per_save_and_for_nothing_else(project: Path, serve) -> None:
    """One watch session, in turn: what reloads nothing (a touch, an identical save, an
    editor's files, the state folder, a broken config edit, a live setting), an atomic save
    and a delete-recreate (one reload each), and a burst of saves (coalesced, never two
    builds at once)."""
    session = serve(project, "--no-tui", command="watch")
    client = Client(config=project)
    model = project.parent / "model.py"
    model.touch()
    model.write_text(model.read_text())
    (project.parent / "notes.swp").write_text("editor swap file")
    (project.parent / "4913").write_text("")
    (project.parent / ".hotreload" / "scratch.txt").write_text("state folder")
    config = project.read_text()
    project.write_text(config.replace("warmup_iters = 3", "warmup_iter = 3"))
    session.wait_for("config error", 30)
    assert "did you mean 'warmup_iters'?" in session.output
    assert "the running session keeps its settings" in session.output
    project.write_text(config.replace("warmup_iters = 3", "warmup_iters = 5"))
    session.wait_for("mlp (warmup_iters): applied, nothing to rebuild", 30)
    time.sleep(2.0)  # longer than the watcher's window since the touches: all flushed
    assert count_events(project, "reload_requested") == 0
    assert client.infer("mlp", X).version == 1

    # An atomic save (a rename over the file) and a delete then recreate: one reload each.
    text = model.read_text()
    tmp = project.parent / ".model.py.tmp-atomic"
    tmp.write_text(text.replace("SCALE = 1.0", "SCALE = 2.0"))
    os.replace(tmp, model)
    wait_version(client, 2)
    model.unlink()
    time.sleep(0.02)
    model.write_text(text.replace("SCALE = 1.0", "SCALE = 4.0"))
    wait_version(client, 3)
    time.sleep(1.0)
    assert count_events(project, "reload_requested") == 2
    assert client.status()["models"][0]["version"] == 3

    # A burst of saves coalesces.
    for i in range(30):
        set_scale(project, 1.0 + i / 100)
        time.sleep(1 / 30)
    wait_until(lambda: count_events(project, "reload_requested") >= 3, 30, what="a reload")
    time.sleep(2.5)  # longer than the max window: every flush has happened
    wait_outcomes(project, count_events(project, "reload_requested"))
    requested = count_events(project, "reload_requested") - 2
    assert 1 <= requested <= 2
    # The newest save is what serves.
    np.testing.assert_allclose(
        client.infer("mlp", X).output,
        client.infer("mlp", X).output,
    )
    running = 0
    for e in read_events(project):
        if e["kind"] == "phase_start" and e["phase"] == "load":
            running += 1
            assert running == 1, "two reloads ran at once"
        if e["kind"] in ("reload_done", "reload_failed"):
            running -= 1


@pytest.mark.parametrize(
    ("policy", "strategy"), [("resource", "inplace"), ("availability", "respawn")]
)
def test_policies_and_strategies(tmp_path: Path, serve, policy: str, strategy: str) -> None:
    config = make_project(tmp_path)
    text = config.read_text()
    text = text.replace('policy = "auto"', f'policy = "{policy}"')
    config.write_text(text.replace('strategy = "inplace"', f'strategy = "{strategy}"'))
    serve(config, "--no-tui", command="watch")
    client = Client(config=config)
    pid = client.status()["models"][0]["pid"]
    traffic = Traffic(config, threads=2)
    try:
        set_scale(config, 2.0)
        wait_version(client, 2)
        model = config.parent / "model.py"
        model.write_text(model.read_text() + "\ndef build():\n    raise RuntimeError('broken')\n")
        wait_outcomes(config, 2)
        n = len(traffic.results)
        wait_until(lambda: len(traffic.results) > n + 10, 30, what="traffic after the failure")
    finally:
        traffic.stop()
    assert traffic.failures == []
    assert client.infer("mlp", X).version == 2
    done = next(e for e in read_events(config) if e["kind"] == "reload_done")
    assert done["policy"] == policy and done["strategy"] == strategy
    new_pid = client.status()["models"][0]["pid"]
    assert (new_pid != pid) == (strategy == "respawn")
    if policy == "resource":
        assert list(done["phases"])[:4] == ["gate", "drain", "sync", "release"]


@pytest.mark.parametrize("mode", ["recycle", "none"])
def test_respawn_builds_in_a_standby_worker(tmp_path: Path, serve, mode: str) -> None:
    """recycle (the default): the retired worker becomes the next standby, so two processes
    take turns; none (`standby = false`): every reload spawns its worker, and the one it
    replaces ends. `recycle = 0` (a new standby after every reload) starts and ends the same
    processes in another order: tests/supervisor/test_strategies.py steps it."""
    config = make_project(tmp_path)
    extra = {"recycle": "", "none": "\nstandby = false"}[mode]
    text = config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"' + extra)
    config.write_text(text)
    proc = serve(config)
    client = Client(config=config, timeout_s=60)

    def standbys() -> list[dict]:
        return [e for e in read_events(config) if e["kind"] == "standby_ready"]

    if mode != "none":
        wait_until(lambda: len(standbys()) == 1, 60, what="the first standby worker")
    base = client.infer("mlp", X).output
    first = serving = client.status()["models"][0]["pid"]
    # recycle: the third reload is the first worker's second reuse; none: each is the same.
    for version in (2, 3, 4) if mode == "recycle" else (2, 3):
        # New code each time: a recycled worker must re-import it, not keep what it ran.
        set_scale(config, float(version))
        assert reloaded(client)
        now = client.status()["models"][0]
        out, answered_by, _ = client.infer("mlp", X)
        assert now["version"] == answered_by == version and now["pid"] != serving
        np.testing.assert_allclose(out, base * version, rtol=1e-5)
        spawn = [
            e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "spawn"
        ][-1]
        if mode == "recycle":
            # Taken: the standby; kept: the worker that served until now.
            assert now["pid"] == standbys()[version - 2]["pid"]
            kept = standbys()[version - 1]
            assert kept["pid"] == serving and kept["recycled"] == (version - 1 + 1) // 2
            assert psutil.Process(serving).status() != "zombie"
            assert ("recycled" in spawn["detail"]) == (version > 2)
            if version == 3:
                assert now["pid"] == first  # the first worker serves again
        else:
            assert "ahead" not in spawn["detail"] and standbys() == []
            gone = not psutil.pid_exists(serving) or psutil.Process(serving).status() == "zombie"
            assert gone, "the retired worker was stopped"
        serving = now["pid"]
    standby = client.status()["models"][0]["standby"]
    if mode == "none":
        assert standby is None
    else:
        wait_until(
            lambda: client.status()["models"][0]["standby"] is not None, 60, what="the standby"
        )
        standby = client.status()["models"][0]["standby"]
        assert standby["pid"] == standbys()[-1]["pid"] and standby["rss_bytes"] > 0
        assert f"standby worker pid {standby['pid']}" in format_status(client.status())
    kids = proc.worker_pids()
    assert len(kids) == (1 if mode == "none" else 2)  # the serving worker (and the standby)
    assert proc.stop() == 0
    assert not [p for p in kids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_a_standby_whose_build_fails_stays_the_standby_for_the_fixed_save(
    tmp_path: Path, serve
) -> None:
    """A broken save fails in the standby; the old version serves on, and a standby with
    torch loaded (no new process for the fixed save) builds the next one. A syntax error is
    the same in any process: the reused standby stays. Another error in a reused worker is
    tried in a fresh one (it might be the reuse); failing there too, that one stays. One
    session, a syntax error then a runtime error, each in a reused standby."""
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"'))
    session = serve(config)
    client = Client(config=config, timeout_s=60)
    wait_until(lambda: count_events(config, "standby_ready") == 1, 60, what="the standby")
    first = client.status()["models"][0]["pid"]
    set_scale(config, 2.0)
    reloaded(client)  # the first worker is now the (recycled) standby
    model = config.parent / "model.py"
    good = model.read_text()
    breakages = {
        "syntax": (good + "\ndef build(:\n", "SyntaxError"),
        "runtime": (
            good + "\ndef build():\n    raise RuntimeError('broken edit')\n",
            "broken edit",
        ),
    }
    reused, version = first, 2
    for broken, (text, error) in breakages.items():
        model.write_text(text)
        outcome = client.reload("mlp")["outcomes"][0]
        assert not outcome["ok"] and outcome["phase"] == "load", (broken, outcome)
        assert error in outcome["error"], (broken, outcome)
        assert client.infer("mlp", X).version == version  # the old version serves on
        kept = [e for e in read_events(config) if e["kind"] == "standby_ready"][-1]
        assert kept["after"] == "a failed build", broken
        assert (kept["pid"] == reused) == (broken == "syntax"), broken
        assert psutil.Process(kept["pid"]).status() != "zombie"
        model.write_text(good)
        done = reloaded(client)
        version += 1
        assert done["version"] == version, broken
        assert client.status()["models"][0]["pid"] == kept["pid"], broken
        # The worker that served until now is the next standby, reused once already.
        wait_until(lambda: client.status()["models"][0]["standby"], 60, what="the standby")
        reused = client.status()["models"][0]["standby"]["pid"]
    assert count_events(config, "recycle_disabled") == 0  # a broken edit is not the reuse
    # The only process started for a reload: the fresh one that retried the runtime error.
    assert count_events(config, "worker_started") == 1 + 1
    assert count_events(config, "phase_end", phase="fresh_spawn") == 1
    assert len(session.worker_pids()) == 2


HELD_FORWARD = """
import pathlib
import time

import model_base

HOLD = True
GATE = pathlib.Path(__file__).with_name("hold")


def build():
    m = model_base.build()
    forward = m.forward

    def held(x):
        until = time.monotonic() + 30
        while HOLD and GATE.exists() and time.monotonic() < until:
            time.sleep(0.01)
        return forward(x)

    m.forward = held
    return m


example_input = model_base.example_input
"""


def test_respawn_hands_over_while_the_old_worker_finishes_its_requests(
    tmp_path: Path, serve
) -> None:
    """No gate closes: requests sent after the swap are answered by the new worker while
    the old one still holds requests sent before it, and those finish there."""
    config = make_project(tmp_path)
    folder = config.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(HELD_FORWARD)
    config.write_text(config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"'))
    serve(config)
    client = Client(config=config, timeout_s=60)
    wait_until(lambda: count_events(config, "standby_ready") == 1, 60, what="the standby")
    (folder / "hold").write_text("")
    held: list[int] = []

    def send_held() -> None:
        held.append(Client(config=config, timeout_s=60).infer("mlp", X).version)

    threads = [threading.Thread(target=send_held) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: client.status()["models"][0]["inflight"] == 2, 30, what="held requests")
    (folder / "model.py").write_text(HELD_FORWARD.replace("HOLD = True", "HOLD = False"))
    outcomes: list[dict] = []
    reload = threading.Thread(target=lambda: outcomes.append(reloaded(client)))
    reload.start()
    try:
        wait_until(
            lambda: count_events(config, "phase_end", phase="swap") == 1, 60, what="the swap"
        )
        assert client.infer("mlp", X).version == 2  # not queued behind the held ones
        assert held == [] and all(t.is_alive() for t in threads)
        assert reload.is_alive()  # still draining the old worker
    finally:
        (folder / "hold").unlink()
        for t in [*threads, reload]:
            t.join(60)
    assert held == [1, 1]
    phases = list(outcomes[0]["phases"])
    assert "gate" not in phases and phases.index("swap") < phases.index("drain")
    drain = [e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "drain"]
    assert drain[-1]["ok"] and "2 request(s) finished on the old worker" in drain[-1]["detail"]


SLOW_BUILD = """
import time
import torch

def build():
    time.sleep(0.4)
    return torch.nn.Identity()

def example():
    return torch.zeros(1, 4)
"""


def test_two_sessions_cpu_reloads_do_not_wait_for_each_other(tmp_path: Path, serve) -> None:
    """Issue 38, item 13: the cross-session lock is for a GPU (loads on one device fragment
    its memory); two unrelated sessions' CPU reloads run side by side, neither waits. The
    GPU lock across sessions: tests/test_reload_lock.py."""
    configs = []
    for name in ("a", "b"):
        configs.append(
            make_project(
                tmp_path / name,
                config=(
                    f'[[models]]\nname = "{name}"\nentry = "slow.py:build"\n'
                    'example = "slow.py:example"\nwarmup_iters = 1\n'
                ),
                files={"slow.py": SLOW_BUILD},
            )
        )
    lock_dir = str(tmp_path / "locks")
    for config in configs:
        serve(config, "--no-tui", command="watch", env={"HOTRELOAD_LOCK_DIR": lock_dir})

    def reload_three(config: Path) -> None:
        client = Client(config=config, timeout_s=60)
        for _ in range(3):
            assert client.reload(force=True)["outcomes"][0]["ok"]

    threads = [threading.Thread(target=reload_three, args=(c,)) for c in configs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    waited = [
        (c.parent.parent.name, e.get("detail"))
        for c in configs
        for e in read_events(c)
        if e.get("phase") == "lock" or e["kind"] == "lock_wait"
    ]
    assert waited == [], "a CPU reload waited for another session's lock"
    done = sum(1 for c in configs for e in read_events(c) if e["kind"] == "reload_done")
    assert done == 6


@pytest.mark.parametrize("strategy", ["inplace", "respawn"])
def test_each_reload_reads_the_code_on_disk_however_its_stamps_look(
    tmp_path: Path, serve, strategy: str
) -> None:
    """A .pyc is trusted on the source's mtime in whole seconds and its size: user code is
    compiled from source instead, or an edit in the same second with the same length would
    serve the previous code. And the folder's listing is re-read on every reload, even when
    a new file lands in the same tick of the folder's modification time as the listing
    cached by the last load."""
    config = make_project(tmp_path)
    config.write_text(
        config.read_text().replace('strategy = "inplace"', f'strategy = "{strategy}"')
    )
    serve(config, env={"PYTHONDONTWRITEBYTECODE": ""})  # .pyc files written, as for users
    client = Client(config=config, timeout_s=60)
    base = client.infer("mlp", X).output
    folder = config.parent
    model = folder / "model.py"
    set_scale(config, 2.0)
    stamp = model.stat().st_mtime_ns
    assert reloaded(client)
    set_scale(config, 3.0)
    os.utime(model, ns=(stamp, stamp))  # saved within the same second
    assert reloaded(client)  # with respawn, both workers have now listed the folder
    out, version, _ = client.infer("mlp", X)
    assert version == 3
    np.testing.assert_allclose(out, base * 3.0, rtol=1e-5)

    stamp = folder.stat().st_mtime_ns
    (folder / "helpers.py").write_text("FACTOR = 5.0\n")
    model.write_text(
        model.read_text().replace("SCALE = 3.0", "from helpers import FACTOR\nSCALE = FACTOR")
    )
    os.utime(folder, ns=(stamp, stamp))  # the folder looks unchanged to a cached listing
    reloaded(client)
    out, version, _ = client.infer("mlp", X)
    assert version == 4
    np.testing.assert_allclose(out, base * 5.0, rtol=1e-5)


def test_stop_during_a_hand_over_answers_the_requests_and_leaves_no_worker(
    tmp_path: Path,
) -> None:
    """Cancelled after the swap (the session stops while the old worker drains): the old
    worker, neither serving nor the standby any more, is stopped with it."""
    import asyncio

    from hotreload.config import load_config
    from hotreload.engine.session import Session
    from hotreload.protocol.tensors import encode_tensors

    config_path = make_project(tmp_path)
    folder = config_path.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(HELD_FORWARD)
    text = config_path.read_text().replace('strategy = "inplace"', 'strategy = "respawn"')
    config_path.write_text(text.replace("[models.env]", "standby = false\n\n[models.env]"))
    config = load_config(config_path)
    metas, blobs = encode_tensors({"input": X})
    header, payload = {"tensors": metas, "form": "single"}, b"".join(bytes(b) for b in blobs)
    pids: list[int] = []

    async def scenario() -> list[int]:
        session = Session(config, endpoint=False, telemetry=False)
        try:
            await session.start()
            host = session.models["mlp"]
            pids.append(host.worker.pid)
            (folder / "hold").write_text("")
            held = [host.router.submit_future(header, payload) for _ in range(2)]
            while host.router.inflight < 2:
                await asyncio.sleep(0.01)
            (folder / "model.py").write_text(HELD_FORWARD.replace("HOLD = True", "HOLD = False"))
            reload = asyncio.create_task(session.reload_model("mlp"))
            while host.reload_phase != "drain":
                await asyncio.sleep(0.01)
            pids.append(host.worker.pid)
        finally:
            stopping = asyncio.create_task(session.stop())
            await asyncio.sleep(0.3)
            (folder / "hold").unlink(missing_ok=True)
            await stopping
        await reload
        answers: list[int | str] = []
        for f in held:
            try:
                answers.append((await f).header["version"])
            except WorkerUnavailableError as exc:
                answers.append(str(exc))
        return answers

    versions = asyncio.run(asyncio.wait_for(scenario(), 120))
    # Answered, each: by the new worker, or (it was computing on the old worker when that
    # was stopped: issue 30's rule, never sent twice) with why.
    assert len(versions) == 2
    assert all(isinstance(v, int) or "not sent again" in v for v in versions), versions
    assert len(pids) == 2 and pids[0] != pids[1]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"

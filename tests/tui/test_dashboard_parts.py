"""The dashboard's pure parts: coalescing, sparklines, tracebacks, reset targets."""

from __future__ import annotations

from hotreload.engine.event_kinds import PhaseStart, ReloadDone, ReloadRequested, State
from hotreload.gpu.readings import GpuSnapshot
from hotreload.tui.messages import EngineEvent, Sampled
from hotreload.tui.render import sparkline, user_traceback
from hotreload.tui.source import reset_target
from tests.scripted_source import cpu_scenario


def test_high_rate_messages_coalesce_but_outcomes_never_do() -> None:
    (sample,), _ = cpu_scenario(steps=3)
    assert Sampled(sample).can_replace(Sampled(sample))
    state = State(model="mlp", state="loading")
    assert EngineEvent(state).can_replace(EngineEvent(State(model="mlp", state="serving")))
    assert not EngineEvent(state).can_replace(EngineEvent(State(model="other", state="loading")))
    assert not EngineEvent(state).can_replace(EngineEvent(PhaseStart(model="mlp", phase="load")))
    done = ReloadDone(
        model="mlp", version=2, total_s=0.1, policy="p", strategy="s", phases={}, trigger="file"
    )
    assert not EngineEvent(done).can_replace(EngineEvent(done))


def test_sparkline_keeps_a_spike_when_squeezed() -> None:
    values = [0.0] * 200
    values[101] = 9.0
    line = sparkline(values, 20)
    assert len(line) == 20 and line.count("█") == 1


def test_traceback_hides_hotreload_frames() -> None:
    from hotreload.tui.render import PACKAGE_DIR

    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{PACKAGE_DIR}worker/loader.py", line 288, in build_version\n'
        "    factory = resolve(spec)\n"
        '  File "/p/model.py", line 44\n'
        "    def broken(:\n"
        "SyntaxError: invalid syntax"
    )
    out = user_traceback(tb)
    assert "loader.py" not in out and "/p/model.py" in out and "1 hotreload frame" in out


def test_a_project_in_a_folder_named_hotreload_keeps_its_frames(tmp_path) -> None:
    """The README's own clone is a folder named hotreload: its model's frames must show."""
    import traceback

    model = tmp_path / "hotreload" / "examples" / "mlp" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text("def forward(x):\n    return undefined_name + x\n")
    namespace: dict = {}
    exec(compile(model.read_text(), str(model), "exec"), namespace)
    try:
        namespace["forward"](1)
    except NameError:
        tb = traceback.format_exc()
    out = user_traceback(tb)
    assert f'File "{model}", line 2, in forward' in out
    assert "return undefined_name + x" in out and "hidden" not in out


def test_no_gpu_reset_target_says_why() -> None:
    snap = GpuSnapshot(0.0, False, "NVML library not found", None, None, ())
    target = reset_target({"name": "mlp", "device": "cpu"}, snap)
    assert target.index is None and "No NVIDIA GPU" in str(target.reason)
    assert reset_target({"name": "mlp", "device": "cuda:1"}, None).index is None


def test_idle_samples_have_equal_activity_and_busy_ones_do_not() -> None:
    from dataclasses import replace

    from hotreload.tui.state import activity

    samples, _ = cpu_scenario(steps=3)
    idle = samples[-1]
    assert activity(idle) == activity(replace(idle, taken_at=idle.taken_at + 1))
    (m,) = idle.models
    busier = {**m, "requests": {**m["requests"], "ok": m["requests"]["ok"] + 1}}
    assert activity(replace(idle, models=(busier,))) != activity(idle)
    assert activity(replace(idle, paused=not idle.paused)) != activity(idle)
    assert activity(replace(idle, phases={"mlp": "load"})) != activity(idle)


def test_a_sample_after_a_long_wait_fills_its_share_of_the_history() -> None:
    from hotreload.tui.state import DashboardState

    samples, _ = cpu_scenario(steps=3)
    state = DashboardState(history_points=10)
    state.update(samples[-1])
    name = samples[-1].models[0]["name"]
    assert len(state.queue[name]) == 10  # full from the start: the sparkline keeps its width
    depth = int(samples[-1].models[0]["queue_depth"])
    before = list(state.p99[name])
    state.update(samples[-1], points=3)
    assert list(state.queue[name])[-4:] == [depth] * 4
    assert list(state.p99[name])[:-3] == before[3:]


def test_the_memory_panel_shows_a_standby_worker() -> None:
    from dataclasses import replace

    from hotreload.tui.render import memory_text
    from hotreload.tui.state import DashboardState

    samples, _ = cpu_scenario(steps=3)
    (m,) = samples[-1].models
    state = DashboardState()
    state.update(samples[-1])
    assert "standby" not in memory_text(state, m["name"], 60).plain
    standby = {"pid": 4242, "rss_bytes": 230 * 2**20, "reuses": 1}
    state.update(replace(samples[-1], models=({**m, "standby": standby},)))
    assert "standby pid 4242 RSS 230.0 MiB" in memory_text(state, m["name"], 60).plain


def test_memory_panel_names_the_serving_workers_cpus() -> None:
    from dataclasses import replace

    from hotreload.tui.render import memory_text
    from hotreload.tui.state import DashboardState

    samples, _ = cpu_scenario(steps=3)
    (m,) = samples[-1].models
    state = DashboardState()
    state.update(replace(samples[-1], models=({**m, "cpus": None},)))
    assert "on CPU" not in memory_text(state, m["name"], 60).plain
    pinned = {"serving": [2, 3], "rest": [0, 1]}
    state.update(replace(samples[-1], models=({**m, "cpus": pinned},)))
    assert "RSS" in (text := memory_text(state, m["name"], 60).plain)
    assert "MiB on CPU 2-3" in text


def test_memory_panel_says_why_cpus_auto_pinned_nothing() -> None:
    from dataclasses import replace

    from hotreload.tui.render import memory_text
    from hotreload.tui.state import DashboardState

    samples, _ = cpu_scenario(steps=3)
    (m,) = samples[-1].models
    state = DashboardState()
    why = {"cpus_unpinned": "`threads` is not set, ...", "cpus_unpinned_short": "threads unset"}
    state.update(replace(samples[-1], models=({**m, "cpus": None, **why},)))
    text = memory_text(state, m["name"], 34).plain  # the Memory panel's width at 80x24
    assert " CPUs not pinned: threads unset" in text


def test_a_running_phase_and_a_long_load_show_their_elapsed_time() -> None:
    from dataclasses import replace

    from hotreload.tui.render import model_rows, reload_rows
    from hotreload.tui.state import DashboardState

    samples, _ = cpu_scenario(steps=3)
    (m,) = samples[-1].models
    state = DashboardState()
    state.update(replace(samples[-1], models=({**m, "state": "loading", "version": 0},)))
    state.on_event(State(model=m["name"], state="loading", ts=100.0))
    (row,) = model_rows(state, str, now=112.4)
    assert str(row[2]) == "loading 12 s"
    state.on_event(ReloadRequested(model=m["name"], trigger="file", queued=False, ts=99.0))
    state.on_event(PhaseStart(model=m["name"], phase="load", ts=100.0))
    assert str(reload_rows(state, str, now=103.4)[0][2]) == "running load 3 s…"
    assert str(reload_rows(state, str, now=109.6)[0][2]) == "running load 10 s…"


def test_traceback_shows_the_users_innermost_frame_first_and_folds_torch(tmp_path) -> None:
    """A forward that fails three modules deep: torch's module.py frames come between the
    user's; the detail starts with the user's raising line and the error, above the fold."""
    import traceback

    import torch  # noqa: F401 - the model file imports it

    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "from torch import nn\n"
        "\n"
        "class Block(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x @ torch.zeros(4, 2)  # line 6: the user's mistake\n"
        "\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body = nn.Sequential(nn.Identity(), Block())\n"
        "    def forward(self, x):\n"
        "        return self.body(x)\n"
        "\n"
        "def run():\n"
        "    return Net()(torch.zeros(1, 3))\n"
    )
    namespace: dict = {}
    exec(compile(model.read_text(), str(model), "exec"), namespace)
    try:
        namespace["run"]()
    except RuntimeError:
        tb = traceback.format_exc()
    assert "nn/modules/module.py" in tb  # what the fold is about
    out = user_traceback(tb).splitlines()
    assert out[0] == "your code, innermost:"
    assert out[1] == f'  File "{model}", line 6, in forward'
    assert any(line.startswith("RuntimeError:") for line in out[2:5]), out[:6]
    folded = [line for line in out if "library frame(s) folded" in line]
    assert folded and "torch/nn/modules/module.py" in folded[0]
    assert not any('modules/module.py", line' in line for line in out), out


def test_help_at_80x24_shows_every_key_and_how_to_close_it() -> None:
    import asyncio

    async def main() -> None:
        from hotreload.tui.app import build_app
        from tests.scripted_source import ScriptedSource, cpu_scenario

        samples, state = cpu_scenario()
        app = build_app(ScriptedSource(samples), state=state)
        app.animation_level = "none"
        async with app.run_test(size=(80, 24)) as pilot:
            await app.wait_for_first_sample(10)  # type: ignore[attr-defined]
            await pilot.press("question_mark")
            await pilot.pause()
            shown = app.export_screenshot()
            for key in ("r / R", "x        reset", "l        start", "q        quit"):
                assert key.replace(" ", "&#160;") in shown or key in shown, key
            assert "closes&#160;this&#160;help" in shown or "closes this help" in shown
            await pilot.press("escape")
            await pilot.pause()
            assert "closes" not in app.export_screenshot()

    asyncio.run(asyncio.wait_for(main(), 60))

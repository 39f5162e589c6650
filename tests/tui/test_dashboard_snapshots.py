"""Snapshots of the dashboard's main screen, fed by the scripted source on a fixed clock.

Review every change to `__snapshots__/` (pytest --snapshot-update writes new ones) before
accepting it: the SVGs are what a user sees.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from hotreload.tui.app import DashboardApp, build_app
from tests.scripted_source import ScriptedSource, cpu_scenario, gpu_scenario


def scripted_app(scenario: Callable[[], tuple]) -> DashboardApp:
    samples, state = scenario()
    app = build_app(ScriptedSource(samples), state=state)
    # Nothing may move between two runs: no cursor blink, no animation.
    app.animation_level = "none"
    return app


async def first_sample(pilot: Pilot) -> None:
    await pilot.app.wait_for_first_sample(10)  # type: ignore[attr-defined]
    await pilot.pause()


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=["120x36", "80x24"])
def test_one_gpu_with_xid_events(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(scripted_app(gpu_scenario), terminal_size=size, run_before=first_sample)


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=["120x36", "80x24"])
def test_no_gpu(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(scripted_app(cpu_scenario), terminal_size=size, run_before=first_sample)


def test_failed_reload_selected_shows_error_and_traceback(snap_compare) -> None:
    assert snap_compare(
        scripted_app(cpu_scenario),
        terminal_size=(120, 36),
        press=["tab", "down"],
        run_before=first_sample,
    )

"""The dashboard on the real example (CPU): real worker processes, real files, real keys."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
from textual.pilot import Pilot
from textual.widgets import Button, Footer, Static

from hotreload.config import load_config
from hotreload.tui.app import DashboardApp, build_app
from hotreload.tui.dialogs import ResetDialog
from hotreload.tui.source import SessionSource
from hotreload.tui.widgets import Panel, RowsTable
from tests.support import ServeProcess

PANELS = ("#status", "#models", "#queue", "#latency", "#memory", "#reloads", "#detail", "#xids")


async def until(pilot: Pilot, predicate: Callable[[], object], what: str, timeout: float = 30):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.05)


def model(app: DashboardApp) -> dict:
    return app.state.model("mlp") or {}


def row_text(table: RowsTable, row: int) -> str:
    if not table.is_valid_row_index(row):
        return ""
    return " ".join(str(c) for c in table.get_row_at(row))


def run_dashboard_test(
    config: Path, body: Callable[[DashboardApp, Pilot], Awaitable[None]]
) -> tuple[DashboardApp, list[int]]:
    """Run `body` against a live dashboard, then quit with `q`; returns the app and the
    worker pids it had, to check that none outlives it."""
    source = SessionSource(load_config(str(config)))
    app = build_app(source, refresh_s=0.1)
    pids: list[int] = []

    async def main() -> None:
        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: model(app).get("state") == "serving", "v1 serving")
                await body(app, pilot)
                pids.extend(source.session.worker_pids())
                await pilot.press("q")
                await until(pilot, lambda: app.return_code is not None, "the app to exit")
        finally:
            await source.stop()  # the same one stop the app ran: a no-op, or the cleanup

    asyncio.run(asyncio.wait_for(main(), 100))
    return app, pids


def assert_gone(pids: list[int]) -> None:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert pids and alive == []


def test_panels_reload_key_reset_dialog_and_quit(project: Path) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        for panel in PANELS:
            assert app.query_one(panel).region.height > 0, f"{panel} is not on screen"
        assert app.query_one(Footer).region.height == 1
        models = app.query_one("#models", RowsTable)
        assert "serving" in row_text(models, 0) and "v1" in row_text(models, 0)
        memory = app.query_one("#memory", Panel).view.plain
        assert "no GPU data: NVML library not found" in memory and "RSS" in memory

        await pilot.press("r")
        reloads = app.query_one("#reloads", RowsTable)
        await until(pilot, lambda: "v2 ok" in row_text(reloads, 0), "v2 in the Reloads panel")
        assert "key" in row_text(reloads, 0)
        for phase in ("load", "warm", "smoke", "drain", "swap", "release"):
            assert phase in row_text(reloads, 0)
        assert model(app)["version"] == 2
        assert "v2" in row_text(models, 0)

        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ResetDialog), "the reset dialog")
        dialog = app.screen
        decision = str(dialog.query_one("#decision", Static).render())
        assert "No NVIDIA GPU" in decision and "NVML library not found" in decision
        assert "Nothing was done" in decision
        assert not dialog.query_one("#confirm", Button).display
        explain = str(dialog.query_one("#explain", Static).render())
        assert "nvidia-smi --gpu-reset" in explain and "[gpu] reset" in explain
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ResetDialog), "the dialog to close")

        await pilot.press("l")  # the load generator moves the Latency panel
        await until(pilot, lambda: (model(app).get("latency") or {}).get("count", 0) > 50, "load")
        await pilot.press("l")
        assert "p99" in app.query_one("#latency", Panel).view.plain

        await pilot.press("p")
        await until(pilot, lambda: app.source.ws.watcher.paused, "the watcher to pause")
        # A sample taken just before the pause may repaint the header once more: wait.
        await until(pilot, lambda: "PAUSED" in app.query_one("#status").view.plain, "PAUSED")
        await pilot.press("p")
        await until(pilot, lambda: not app.source.ws.watcher.paused, "the watcher to resume")

    app, pids = run_dashboard_test(project, body)
    assert app.return_code == 0
    assert_gone(pids)


def test_broken_save_shows_the_error_while_the_old_version_serves(project: Path) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        # Let the watcher take its baseline before the edit.
        await until(pilot, lambda: app.source.ws.watcher.watching, "the watcher")
        path = project.parent / "model.py"
        path.write_text(path.read_text() + "\ndef broken(:\n")
        reloads = app.query_one("#reloads", RowsTable)
        await until(pilot, lambda: "FAILED load" in row_text(reloads, 0), "a failed reload")
        assert "file model.py" in row_text(reloads, 0)
        detail = app.query_one("#detail", Panel).view.plain
        assert "SyntaxError" in detail and "v1 keeps serving" in detail
        assert "model.py" in detail  # the traceback points at the user's file
        assert model(app)["state"] == "serving" and model(app)["version"] == 1
        assert "FAILED in load" in row_text(app.query_one("#models", RowsTable), 0)

    app, pids = run_dashboard_test(project, body)
    assert app.return_code == 0
    assert_gone(pids)


def test_plain_mode_when_stdout_is_not_a_terminal(project: Path) -> None:
    proc = ServeProcess(project, command="watch")  # no --no-tui: stdout is a pipe
    try:
        proc.wait_ready()
        assert any(line.startswith("watching") or " watching " in line for line in proc.lines)
        assert proc.stop() == 0
    finally:
        proc.close()

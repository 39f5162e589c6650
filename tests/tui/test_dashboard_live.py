"""The dashboard on the real example (CPU): real worker processes, real files, real keys.

The app attaches over the socket to a real `hotreload watch --no-tui` session (the same
path `hotreload watch` in a terminal takes, minus the terminal); the last tests run
`hotreload watch` itself under a pseudo-terminal and press keys into it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import psutil
import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Footer, Static

from hotreload.client import Client, resolve_socket
from hotreload.exitcodes import EXIT_ENVIRONMENT
from hotreload.tui.app import DashboardApp, build_app
from hotreload.tui.dialogs import ResetDialog
from hotreload.tui.remote import RemoteSource
from hotreload.tui.widgets import Panel, RowsTable
from tests.support import ServeProcess, kill_groups, make_project, wait_until

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
) -> DashboardApp:
    """Attach a dashboard to the session serving `config`, run `body`, then press `q`."""
    source = RemoteSource(resolve_socket(config, None))
    app = build_app(source, refresh_s=0.1, owner=False)

    async def main() -> None:
        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: model(app).get("state") == "serving", "v1 serving")
                await body(app, pilot)
                await pilot.press("q")
                await until(pilot, lambda: app.return_code is not None, "the app to exit")
        finally:
            await source.stop()

    asyncio.run(asyncio.wait_for(main(), 100))
    return app


@pytest.fixture
def watching(project: Path, serve: ServeProcess.Factory) -> ServeProcess:
    """`hotreload watch --no-tui` on the example, serving."""
    proc = serve(project, "--no-tui", command="watch")
    proc.wait_for("watching")
    return proc


def test_panels_reload_key_reset_dialog_and_detach(watching: ServeProcess) -> None:
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
        # The row holds the phases that fit its width; the detail line under it, all of them.
        assert "load" in row_text(reloads, 0)
        detail = app.query_one("#detail", Panel).view.plain
        for phase in ("load", "warm", "smoke", "drain", "swap", "release"):
            assert phase in detail
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
        await until(pilot, lambda: app.state.sample.paused, "the session to report a pause")
        # A sample taken just before the pause may repaint the header once more: wait.
        await until(pilot, lambda: "PAUSED" in app.query_one("#status").view.plain, "PAUSED")
        await pilot.press("p")
        await until(pilot, lambda: not app.state.sample.paused, "the watcher to resume")

    app = run_dashboard_test(watching.config, body)
    assert app.return_code == 0
    # Attached from elsewhere, q only detaches: the session still serves.
    with Client(watching.config, timeout_s=10) as client:
        assert client.status()["models"][0]["state"] == "serving"


def test_broken_save_shows_the_error_while_the_old_version_serves(
    watching: ServeProcess,
) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        path = watching.config.parent / "model.py"
        path.write_text(path.read_text() + "\ndef broken(:\n")
        reloads = app.query_one("#reloads", RowsTable)
        await until(pilot, lambda: "FAILED load" in row_text(reloads, 0), "a failed reload")
        assert "file model.py" in row_text(reloads, 0)
        detail = app.query_one("#detail", Panel).view.plain
        assert "SyntaxError" in detail and "v1 keeps serving" in detail
        assert "model.py" in detail  # the traceback points at the user's file
        assert model(app)["state"] == "serving" and model(app)["version"] == 1
        assert "FAILED in load" in row_text(app.query_one("#models", RowsTable), 0)

    app = run_dashboard_test(watching.config, body)
    assert app.return_code == 0


def test_a_failed_start_waits_for_the_fix_then_pause_shows_a_change_waiting(
    tmp_path: Path, serve: ServeProcess.Factory
) -> None:
    config = make_project(tmp_path)
    path = config.parent / "model.py"
    good = path.read_text()
    path.write_text(good + "\ndef build():\n    raise RuntimeError('not yet')\n")
    # watch --no-tui waits for the fix, as the dashboard and `uvicorn --reload` do.
    watch = serve(config, "--no-tui", command="watch", wait_ready=False)
    watch.wait_for("could not start (see above): fix the file and save")
    assert "not yet" in watch.output and watch.proc.poll() is None

    source = RemoteSource(resolve_socket(config, None))
    app = build_app(source, refresh_s=0.1, owner=False)

    def header() -> str:
        return app.query_one("#status").view.plain  # type: ignore[attr-defined]

    async def main() -> None:
        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: "start failed" in header(), "the start failure")
                path.write_text(good)
                await until(pilot, lambda: model(app).get("state") == "serving", "the fix")
                # The header no longer says the start failed once the model came up.
                await until(pilot, lambda: "start failed" not in header(), "a clear header")
                assert "watching" in header()

                await pilot.press("p")
                await until(pilot, lambda: "PAUSED" in header(), "PAUSED")
                path.write_text(good.replace("SCALE = 1.0", "SCALE = 2.0"))
                await until(pilot, lambda: "1 change waiting" in header(), "1 change waiting")
                assert model(app)["version"] == 1  # nothing reloads while paused
                await pilot.press("p")
                await until(pilot, lambda: model(app).get("version") == 2, "v2 after resume")
                await pilot.press("q")
                await until(pilot, lambda: app.return_code is not None, "the app to exit")
        finally:
            await source.stop()

    asyncio.run(asyncio.wait_for(main(), 100))
    watch.wait_for("resumed: reloading 1 change made while paused")
    with Client(config, timeout_s=10) as client:
        assert client.call({"op": "dashboard"}).header["start_state"] == "started"


def test_plain_mode_when_stdout_is_not_a_terminal(project: Path) -> None:
    proc = ServeProcess(project, command="watch")  # no --no-tui: stdout is a pipe
    try:
        proc.wait_ready()
        assert any(line.startswith("watching") or " watching " in line for line in proc.lines)
        assert proc.stop() == 0
    finally:
        proc.close()


def test_attaching_to_a_serve_session_says_what_to_run(
    project: Path, serve: ServeProcess.Factory
) -> None:
    serve(project)
    source = RemoteSource(resolve_socket(project, None))
    app = build_app(source, owner=False)

    async def main() -> None:
        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: app.return_code is not None, "the app to give up")
        finally:
            await source.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert app.return_code == EXIT_ENVIRONMENT
    assert "hotreload serve" in (app.exit_message or "")
    assert "hotreload watch" in (app.exit_message or "")


def test_an_attached_dashboard_leaves_cleanly_when_the_session_stops(
    watching: ServeProcess,
) -> None:
    source = RemoteSource(resolve_socket(watching.config, None))
    app = build_app(source, refresh_s=0.1, owner=False)

    async def main() -> None:
        try:
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: model(app).get("state") == "serving", "v1 serving")
                await asyncio.to_thread(watching.stop)
                await until(pilot, lambda: app.return_code is not None, "the app to leave")
        finally:
            await source.stop()

    asyncio.run(asyncio.wait_for(main(), 100))
    assert app.return_code == 0 and app.exit_message == "the session stopped"


class PtyWatch:
    """`hotreload watch` with a pseudo-terminal (120x36) as its terminal, as a user runs it."""

    def __init__(self, config: Path) -> None:
        self.config = config
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hotreload", "watch", "--config", str(config)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=str(config.parent),
            env=dict(os.environ, TERM="xterm-256color"),
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.screen = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # Read everything, as a terminal would: a full pty would stall the app.
        try:
            while chunk := os.read(self.master, 65536):
                self.screen += chunk
        except OSError:
            pass

    @property
    def text(self) -> str:
        return self.screen.decode("utf-8", "replace")

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def serving(self) -> bool:
        try:
            with Client(self.config, timeout_s=5) as client:
                return client.status()["models"][0]["state"] == "serving"
        except Exception:
            return False

    def close(self) -> None:
        kids = self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_groups(self.proc, [k.pid for k in kids])
        os.close(self.master)
        self._reader.join(5)


@pytest.fixture
def pty_watch(project: Path) -> Iterator[PtyWatch]:
    w = PtyWatch(project)
    try:
        yield w
    finally:
        w.close()


def _dashboard_of(w: PtyWatch) -> psutil.Process:
    for p in w.tree():
        if "dashboard" in p.cmdline():
            return p
    raise AssertionError("no dashboard process under hotreload watch")


def assert_gone(procs: list[psutil.Process]) -> None:
    alive = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert procs and alive == []


def test_watch_in_a_terminal_draws_in_its_own_lower_priority_process_and_q_stops_all(
    pty_watch: PtyWatch,
) -> None:
    w = pty_watch
    wait_until(w.serving, 90, what="the session to serve")
    wait_until(lambda: "Reloads" in w.text and "Xid events" in w.text, 30, what="the screen")
    dash = _dashboard_of(w)
    assert dash.nice() == 10 and psutil.Process(w.proc.pid).nice() == 0
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1:
        # The session keeps off the serving CPU (`cpus`); its niced drawing may go anywhere.
        everywhere = os.sched_getaffinity(0)
        assert set(psutil.Process(w.proc.pid).cpu_affinity()) < everywhere
        assert set(dash.cpu_affinity()) == everywhere
    procs = w.tree()
    assert len(procs) >= 2  # the dashboard and the model's worker

    os.write(w.master, b"r")  # a key in the dashboard reloads in the session
    wait_until(
        lambda: Client(w.config, timeout_s=5).status()["models"][0]["version"] == 2,
        30,
        what="r to reload to v2",
    )
    os.write(w.master, b"q")
    assert w.proc.wait(60) == 0
    assert_gone(procs)
    wait_until(lambda: "stopped" in w.text, 10, what="the closing lines")
    assert "stopping: draining requests" in w.text


def test_sigterm_to_watch_closes_the_dashboard_and_stops_cleanly(pty_watch: PtyWatch) -> None:
    w = pty_watch
    wait_until(w.serving, 90, what="the session to serve")
    _dashboard_of(w)
    procs = w.tree()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(60) == 0
    assert_gone(procs)


def test_a_closed_terminal_still_stops_the_session_cleanly(pty_watch: PtyWatch) -> None:
    w = pty_watch
    wait_until(w.serving, 90, what="the session to serve")
    _dashboard_of(w)
    procs = w.tree()
    socket_path = resolve_socket(w.config, None)
    assert socket_path.exists()
    os.close(w.master)  # the terminal window closed: every write to it now fails
    w.master = os.open(os.devnull, os.O_RDONLY)  # for close() to close
    w.proc.send_signal(signal.SIGHUP)
    w.proc.wait(60)
    assert_gone(procs)
    assert not socket_path.exists()


def test_dashboard_command_needs_a_terminal(project: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "dashboard", "--config", str(project)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2
    assert "needs a terminal" in out.stderr and "hotreload status" in out.stderr

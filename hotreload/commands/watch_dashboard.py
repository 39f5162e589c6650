"""`hotreload watch` in a terminal: this process serves, a child process draws.

The dashboard (`hotreload dashboard --owner`) runs in its own process at a lower priority
and attaches over the session's socket, so Textual's repaints never take this event loop or
its GIL from the request path. While it owns the terminal, this process's own output and
its workers' prints go to `.hotreload/watch.log` instead of tearing the screen. When the
dashboard exits (`q`), or this process gets SIGINT/SIGTERM/SIGHUP, the session drains and
stops every worker here, in plain lines on the restored terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.paths import ensure_state_dir, open_private

if TYPE_CHECKING:
    from hotreload.commands.watch_session import WatchSession

#: How long a dashboard asked to quit may take before it is killed.
DASHBOARD_QUIT_S = 10.0
#: Leave the alternate screen and show the cursor: what a killed Textual app left undone.
_RESET_SCREEN = b"\x1b[?1049l\x1b[?25h\x1b[0m\r\n"


@contextlib.contextmanager
def output_to(fd: int) -> Iterator[None]:
    """Point this process's stdout and stderr (fds 1 and 2, which workers inherit) at `fd`
    for the duration, then restore them, whatever happens in between."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        try:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for f in saved:
                os.close(f)


def _terminal_state() -> Any:
    try:
        import termios

        return termios.tcgetattr(0)
    except Exception:  # not a terminal, or no termios: nothing to restore later
        return None


def _restore_terminal(state: Any) -> None:
    """After a dashboard that was killed: cooked mode, main screen, cursor back."""
    with contextlib.suppress(Exception):
        import termios

        if state is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, state)
        os.write(1, _RESET_SCREEN)


async def _stop_child(child: asyncio.subprocess.Process, terminal: Any) -> None:
    if child.returncode is not None:
        return
    child.send_signal(signal.SIGTERM)  # the app quits on SIGTERM, like `q`
    try:
        await asyncio.wait_for(child.wait(), DASHBOARD_QUIT_S)
    except TimeoutError:
        child.kill()
        await child.wait()
        _restore_terminal(terminal)


async def watch_with_dashboard(ws: WatchSession) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    log = ensure_state_dir(ws.config.state_dir) / "watch.log"
    try:
        await ws.session.open()  # a taken socket fails here, before the screen is taken
    except BaseException:
        await ws.stop()
        raise
    code = EXIT_OK
    terminal = _terminal_state()
    child: asyncio.subprocess.Process | None = None
    try:
        log_fd = open_private(log, os.O_WRONLY | os.O_TRUNC)
        try:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hotreload",
                "dashboard",
                "--socket",
                str(ws.session.socket_path),
                "--owner",
            )
            ws.session.release_from_cpus(child.pid)
            with output_to(log_fd):
                starting = asyncio.ensure_future(ws.start_keep_going())
                exited = asyncio.ensure_future(child.wait())
                signalled = asyncio.ensure_future(stop.wait())
                await asyncio.wait({exited, signalled}, return_when=asyncio.FIRST_COMPLETED)
                signalled.cancel()
                if exited.done() and child.returncode != 0:
                    code = child.returncode if child.returncode > 0 else EXIT_FAILURE
                    if child.returncode < 0:
                        _restore_terminal(terminal)  # it died by a signal, screen as it was
                if not starting.done():
                    starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting
        finally:
            os.close(log_fd)
            if child is not None:
                await _stop_child(child, terminal)  # asked to stop, or an error above
        if code != EXIT_OK:
            _say(
                f"hotreload: the dashboard exited with code {child.returncode if child else '?'}"
                " (its message is above); stopping the session"
            )
    finally:
        _say("stopping: draining requests and stopping workers...")
        await ws.stop()
        _say("stopped")
        if log.exists() and log.stat().st_size:
            _say(f"output of the session and its workers: {log}")
    return code


def _say(line: str) -> None:
    # After SIGHUP the terminal is gone and a print raises: the stop must still happen.
    with contextlib.suppress(OSError):
        print(line, flush=True)

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
from pathlib import Path
from typing import TYPE_CHECKING

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.paths import ensure_state_dir

if TYPE_CHECKING:
    from hotreload.engine.watch import WatchSession

#: How long a dashboard asked to quit may take before it is killed.
DASHBOARD_QUIT_S = 10.0


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr (fds 1 and 2, which workers inherit) at
    `path` for the duration, then restore them."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


async def watch_with_dashboard(ws: WatchSession) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    log = ensure_state_dir(ws.config.state_dir) / "watch.log"
    code = EXIT_OK
    try:
        await ws.session.open()  # a taken socket fails here, before the screen is taken
    except BaseException:
        await ws.stop()
        raise
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
        with output_to(log):
            starting = asyncio.ensure_future(ws.start_keep_going())
            exited = asyncio.ensure_future(child.wait())
            signalled = asyncio.ensure_future(stop.wait())
            await asyncio.wait({exited, signalled}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                child.send_signal(signal.SIGTERM)  # the app quits on SIGTERM, like `q`
                try:
                    await asyncio.wait_for(asyncio.shield(exited), DASHBOARD_QUIT_S)
                except TimeoutError:
                    child.kill()
                    await exited
            elif child.returncode != 0:
                code = child.returncode if child.returncode > 0 else EXIT_FAILURE
            signalled.cancel()
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting
        if code != EXIT_OK:
            _say(
                f"hotreload: the dashboard exited with code {child.returncode} (its message is "
                "above); stopping the session"
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

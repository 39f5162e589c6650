"""`hotreload watch`: serve every model and reload it when its files change.

Plain mode (`--no-tui`, or stdout not a terminal) prints one line per phase and outcome;
the dashboard subscribes to the same event stream.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from hotreload.commands import dashboard_ops
from hotreload.commands.printer import PlainPrinter
from hotreload.commands.serve import run_until_signal, run_with_config
from hotreload.commands.watch_session import WatchSession
from hotreload.config import Config


def _watch_session(config: Config) -> WatchSession:
    """A WatchSession with the dashboard ops on its socket: `hotreload dashboard` attaches
    to a `--no-tui` session as to the one `watch` opens itself."""
    ws = WatchSession(config)
    dashboard_ops.register(ws)
    return ws


async def _watch_plain(config: Config) -> int:
    ws = _watch_session(config)
    ws.session.events.subscribe(PlainPrinter())

    def banner() -> str:
        if ws.start_error is not None:
            # As the dashboard and `uvicorn --reload` do: wait for the fix, not exit.
            failed = [n for n, h in ws.session.models.items() if h.state != "serving"]
            return (
                f"{', '.join(failed)} could not start (see above): fix the file and save, "
                "the watcher tries again - Ctrl-C to stop"
            )
        return (
            f"serving {len(ws.session.models)} model(s) on {ws.session.socket_path}; "
            "edit a file to reload - Ctrl-C to stop"
        )

    return await run_until_signal(ws.start_keep_going, ws.stop, banner)


def watch_main(config_path: str | None, *, no_tui: bool = False, **overrides: Any) -> int:
    def run(config: Config) -> int:
        if not no_tui and sys.stdout.isatty() and sys.stdin.isatty():
            from hotreload.commands.watch_dashboard import watch_with_dashboard

            return asyncio.run(watch_with_dashboard(_watch_session(config)))
        return asyncio.run(_watch_plain(config))

    return run_with_config(config_path, overrides, run)

"""The `hotreload watch` dashboard (Textual). Only this package imports textual."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotreload.config import Config


def run_dashboard(config: Config) -> int:
    """Run the session and its dashboard on one event loop; returns the exit code."""
    import asyncio
    import signal
    import sys

    from hotreload.tui.app import build_app
    from hotreload.tui.source import SessionSource

    async def main() -> int:
        source = SessionSource(config)
        app = build_app(source)
        loop = asyncio.get_running_loop()
        # SIGTERM only asks the app to quit: the orderly stop (drain, join) does the rest.
        loop.add_signal_handler(signal.SIGTERM, lambda: app.call_later(app.action_quit))
        try:
            await app.run_async()
        finally:
            await source.stop()  # idempotent: after a crash too, no worker outlives us
        if app.exit_message:
            print(f"hotreload: {app.exit_message}", file=sys.stderr)
        return app.return_code or 0

    return asyncio.run(main())

"""The `hotreload watch` dashboard (Textual). Only this package imports textual."""

from __future__ import annotations

import os

#: The dashboard process's niceness under `hotreload watch`: drawing yields the CPU to the
#: session and its workers, so a busy screen never shows up in request latency.
DASHBOARD_NICE = 10


def run_dashboard(socket_path: str | os.PathLike[str], *, owner: bool = False) -> int:
    """Attach a dashboard to the session serving on `socket_path`; returns the exit code.

    `owner`: started by `hotreload watch` itself, which stops the session when this process
    exits; `q` then means "stop everything" instead of "detach"."""
    import asyncio
    import signal
    import sys

    from hotreload.tui.app import build_app
    from hotreload.tui.remote import RemoteSource

    if owner:
        os.nice(DASHBOARD_NICE)

    async def main() -> int:
        source = RemoteSource(socket_path)
        app = build_app(source, owner=owner)
        loop = asyncio.get_running_loop()
        # SIGTERM (from `hotreload watch`, or a user) asks the app to quit like `q`.
        loop.add_signal_handler(signal.SIGTERM, lambda: app.call_later(app.action_quit))
        try:
            await app.run_async()
        finally:
            await source.stop()
        if app.exit_message:
            print(f"hotreload: {app.exit_message}", file=sys.stderr)
        return app.return_code or 0

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:  # Ctrl-C before the app took the terminal
        return 130

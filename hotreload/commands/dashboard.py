"""`hotreload dashboard`: the live dashboard, attached to a running `hotreload watch`."""

from __future__ import annotations

import sys

from hotreload.errors import ConfigError
from hotreload.exitcodes import EXIT_USAGE, error_exit


def dashboard_main(config: str | None, socket_path: str | None, *, owner: bool = False) -> int:
    from hotreload.client import resolve_socket

    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        print(
            "hotreload: the dashboard needs a terminal; use `hotreload status` for figures "
            "from a script",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        path = resolve_socket(config, socket_path)
    except ConfigError as exc:
        return error_exit("hotreload", exc)
    # Imported here: every other command stays free of textual.
    from hotreload.tui import run_dashboard

    return run_dashboard(path, owner=owner)

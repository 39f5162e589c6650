"""`hotreload serve`: run a session until SIGINT or SIGTERM, then drain and stop cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from hotreload.config import Config, load_config, with_cli_overrides
from hotreload.engine.host import BringUpError
from hotreload.engine.printer import PlainPrinter
from hotreload.engine.session import Session
from hotreload.errors import ConfigError, HotreloadError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_FAILURE, EXIT_OK, EXIT_USAGE


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM only set a flag; the main coroutine does the orderly shutdown."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _serve(config: Config) -> int:
    session = Session(config)
    printer = PlainPrinter()
    session.events.subscribe(printer)
    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        try:
            await session.start()
        except BringUpError:
            return EXIT_FAILURE  # the event printer already showed the error and traceback
        print(
            f"serving {len(session.hosts)} model(s) on {session.socket_path} - Ctrl-C to stop",
            flush=True,
        )
        await stop.wait()
        print("stopping: draining requests and stopping workers...", flush=True)
        return EXIT_OK
    finally:
        await session.stop()
        print("stopped", flush=True)


def serve_main(config_path: str | None, **overrides: Any) -> int:
    try:
        config = with_cli_overrides(load_config(config_path), **overrides)
    except ConfigError as exc:
        print(f"hotreload: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_serve(config))
    except HotreloadError as exc:
        print(f"hotreload: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT

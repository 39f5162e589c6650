"""`hotreload serve`: run a session until SIGINT or SIGTERM, then drain and stop cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from hotreload.commands.printer import PlainPrinter
from hotreload.config import Config, load_config, with_cli_overrides
from hotreload.engine.endpoint import AlreadyServingError, socket_answers
from hotreload.engine.model import PhaseFailed
from hotreload.engine.session import FrontEnd, FrontEndStarter, Session
from hotreload.errors import ConfigError, HotreloadError
from hotreload.exitcodes import EXIT_OK, error_exit, exit_code_for
from hotreload.paths import runtime_dir_note, socket_path_for
from hotreload.preflight import preflight


def http_front_ends(config: Config) -> list[FrontEndStarter]:
    """The KServe v2 HTTP endpoint as a starter for `Session(front_ends=...)` when `[http]`
    (or `--http`) enables it: the session opens it after its socket, before the models start,
    so readiness is observable during warm-up, and closes it after the hosts drained."""
    http = config.http
    if not http.enabled:
        return []

    async def start(session: Session) -> FrontEnd:
        # Imported here: aiohttp and the HTTP layer load only for a session that serves HTTP.
        from hotreload.http import start_http

        return await start_http(session, http.host, http.port, metrics_port=http.metrics_port)

    return [start]


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM only set a flag; the main coroutine does the orderly shutdown."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def run_until_signal(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    banner: Callable[[], str],
) -> int:
    """Plain mode: start, print the banner, serve until SIGINT/SIGTERM, then stop cleanly."""
    stopping = asyncio.Event()
    install_stop_signals(stopping)
    try:
        # Ctrl-C during a long first load stops at once instead of after the load.
        starting = asyncio.ensure_future(start())
        signalled = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, PhaseFailed):
                await starting
            print("stopping before the models were ready...", flush=True)
            return EXIT_OK
        signalled.cancel()
        try:
            starting.result()
        except PhaseFailed as exc:
            # The event printer already showed the error and traceback. A worker process
            # that could not start (no such device, no CUDA build) is the environment's
            # doing (exit 3), as `hotreload check` says too; a model that failed to build
            # is not (exit 1).
            return exit_code_for(exc)
        print(banner(), flush=True)
        await stopping.wait()
        print("stopping: draining requests and stopping workers...", flush=True)
        return EXIT_OK
    finally:
        await stop()
        print("stopped", flush=True)


async def _serve(config: Config) -> int:
    session = Session(config, front_ends=http_front_ends(config))
    session.events.subscribe(PlainPrinter())
    failed: list[str] = []

    async def start() -> None:
        # One model that cannot start does not take the others down; with none up, exit 1.
        failed[:] = await session.start(keep_others=True)

    def banner() -> str:
        up = len(session.models) - len(failed)
        text = f"serving {up} model(s) on {session.socket_path} - Ctrl-C to stop"
        if failed:
            names = ", ".join(failed)
            text += (
                f"\n{len(failed)} model(s) failed to start and answer with why: {names}; "
                f"fix, then `hotreload reload {failed[0]}`"
            )
        return text

    return await run_until_signal(start, session.stop, banner)


def run_with_config(
    config_path: str | None, overrides: dict[str, Any], run: Callable[[Config], int]
) -> int:
    """Load the config (exit 2 with the error when it is wrong), then `run(config)`;
    an environment problem (socket in use, no permission) exits 3 with its message."""
    try:
        config = with_cli_overrides(load_config(config_path), **overrides)
        preflight(config)  # before any start-up work: exits 2 at once, not after a worker
    except ConfigError as exc:
        return error_exit("hotreload", exc)
    try:
        # Before anything is built: a second `watch`/`serve` on a live config says so and
        # exits 3, and writes nothing into the live session's state folder.
        socket_file = socket_path_for(config.path, config.socket_dir)
        note = runtime_dir_note() if config.socket_dir is None else None
        if note:
            print(f"hotreload: note: {note}", file=sys.stderr, flush=True)
        if socket_answers(socket_file):
            raise AlreadyServingError(socket_file)
        return run(config)
    except HotreloadError as exc:  # a ConfigError here was checked against this machine
        return error_exit("hotreload", exc, config.path)


def serve_main(config_path: str | None, **overrides: Any) -> int:
    return run_with_config(config_path, overrides, lambda c: asyncio.run(_serve(c)))

"""`hotreload reload [MODEL]`: ask the running session for a reload, wait, print the outcome.

Meant for an editor key binding: exits 0 when every reload succeeded, 1 when one failed
(the old version keeps serving), 3 when no session runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from hotreload.client import AsyncClient
from hotreload.engine.event_kinds import CheckpointWait, LockWait
from hotreload.engine.events import typed
from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.protocol.framing import Frame
from hotreload.session_call import call_session


def format_outcome(o: dict[str, Any]) -> str:
    phases = "  ".join(f"{k} {v * 1000:.0f}ms" for k, v in o.get("phases", {}).items())
    if o["ok"] and o.get("unchanged"):
        return f"{o['model']}: {o['detail'][-1] if o.get('detail') else 'unchanged'}"
    if o["ok"]:
        head = f"{o['model']}: reloaded -> v{o['version']} in {o['total_s']:.2f} s"
        return f"{head} ({o['policy']}, {o['strategy']})\n  {phases}"
    text = (
        f"{o['model']}: reload FAILED in {o.get('phase')}: {o.get('error')}\n"
        f"  v{o['version']} keeps serving\n  {phases}"
    )
    if o.get("traceback"):
        text += "\n" + o["traceback"].rstrip()
    return text


def print_outcomes(
    reply: dict[str, Any] | None,
    code: int | None,
    as_json: bool,
    fmt: Callable[[dict[str, Any]], str],
) -> int:
    """A job's outcomes as `hotreload reload` and `rollback` print them; the exit code."""
    if reply is None:
        return code or EXIT_FAILURE
    outcomes = reply.get("outcomes", [])
    if as_json:
        print(json.dumps(outcomes, indent=2))
    else:
        for o in outcomes:
            print(fmt(o))
    return EXIT_OK if outcomes and all(o["ok"] for o in outcomes) else EXIT_FAILURE


class WaitNotes:
    """Prints, while the reload runs, what it waits for (a lock another session holds, a
    checkpoint still being written): a reload silent for 20 s reads as a hang. A thread with
    its own loop and connection, so the reload's blocking call is left as it is; a session
    it cannot reach is the main call's to report."""

    def __init__(self, config: str | None, model: str | None) -> None:
        self.config, self.model = config, model
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reload-notes", daemon=True)

    def __enter__(self) -> WaitNotes:
        self._thread.start()
        self._ready.wait(2.0)  # subscribed (or given up): a wait from now on is seen
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(2.0)

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(self._watch())
        self._ready.set()

    async def _watch(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        def on_frame(frame: Frame | None) -> None:
            wire = frame.header.get("event") if frame is not None else None
            if not isinstance(wire, dict) or frame is None or frame.header.get("replayed"):
                return
            # Said at once while the reload waits: why it has not answered yet.
            match typed(wire):
                case LockWait(model=m, message=message) | CheckpointWait(model=m, message=message):
                    if self.model in (None, m):
                        print(f"{m}: {message}", file=sys.stderr, flush=True)

        client = AsyncClient(self.config)
        try:
            await client.subscribe({"op": "events"}, on_frame)
            self._ready.set()
            await self._stop.wait()
        finally:
            await client.close()


def reload_main(
    config: str | None, model: str | None, *, as_json: bool = False, force: bool = False
) -> int:
    """`force`: build even when nothing changed since the serving version's build (by
    default such a reload is a no-op that says "unchanged: nothing to reload")."""
    # No timeout: a reload takes as long as the model's load (its deadlines bound it).
    with WaitNotes(config, model):
        reply, code = call_session(config, lambda c: c.reload(model, force=force), timeout_s=None)
    return print_outcomes(reply, code, as_json, format_outcome)

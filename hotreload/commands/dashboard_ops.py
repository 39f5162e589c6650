"""Socket ops a dashboard in another process drives a `hotreload watch` session with.

The dashboard runs in its own (lower-priority) process so that drawing never takes the
manager's event loop or its GIL from the request path. It reaches the session over the
client socket with these ops:

- `events` (a subscription): the recent events, then each new one as it is emitted;
- `dashboard`: one sample of everything the panels show, in one reply;
- `pause` (`paused`: bool), `rewarm` (`model`), `reset_check` / `reset_gpu` (`index`).

`reload` is the same op `hotreload reload` uses. Everything is plain JSON; the dashboard
turns it back into its dataclasses (`hotreload.tui.remote`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from hotreload.engine.endpoint import Push
from hotreload.engine.event_kinds import BaseEvent
from hotreload.engine.events import as_dict
from hotreload.errors import BadRequestError

if TYPE_CHECKING:
    from hotreload.commands.watch_session import WatchSession

#: How many past events a new subscriber gets first (bring-up, the last reloads).
REPLAY_EVENTS = 200
#: Reloads per sample: the panel shows the newest; a long session's history stays home.
MAX_RELOADS = 100
#: Workers are asked for RSS and allocator figures at most this often for the dashboard;
#: router figures are always fresh. Each worker status costs its serving thread a moment.
WORKER_STATUS_MAX_AGE_S = 2.0

Reply = tuple[dict[str, Any], list[Any]]


def _plain(event: BaseEvent) -> dict[str, Any]:
    """The event as a wire dict of plain JSON values (paths and the like as strings), as
    events.jsonl has it: the one place the stream leaves the process."""
    return json.loads(json.dumps(as_dict(event), default=str))


def _http_url(front_ends: list[Any]) -> str | None:
    """The HTTP endpoint's base URL, when the session serves HTTP."""
    for front_end in front_ends:
        url = getattr(front_end, "url", None)
        if isinstance(url, str):
            return url
    return None


def register(ws: WatchSession) -> None:
    """Add the dashboard ops to the session's socket."""
    session = ws.session

    def events(header: dict[str, Any], push: Push) -> Callable[[], None]:
        replay = int(header.get("replay", REPLAY_EVENTS))
        for event in list(session.events.recent)[-replay:] if replay > 0 else []:
            push({"ok": True, "event": _plain(event), "replayed": True})
        stop: list[Callable[[], None]] = []

        def forward(event: BaseEvent) -> None:
            if not push({"ok": True, "event": _plain(event)}) and stop:
                stop[0]()  # the subscriber went away (or stopped reading)

        stop.append(session.events.subscribe(forward))
        return stop[0]

    async def dashboard(header: dict[str, Any], payload: Any) -> Reply:
        status = await session.status(worker_max_age_s=WORKER_STATUS_MAX_AGE_S)
        tel = session.telemetry
        reloads = sorted(
            (o for r in session.models.values() for o in r.history[-MAX_RELOADS:]),
            key=lambda o: o.started_at,
        )[-MAX_RELOADS:]
        snapshot = session.gpu_snapshot
        views = {name: h.view for name, h in session.models.items()}
        return {
            "ok": True,
            "start_state": ws.start_state,
            "start_error": ws.start_error,
            "config": str(ws.config.path),
            "reset_mode": ws.config.gpu.reset,
            "models": status["models"],
            "reloads": [o.as_dict() for o in reloads],
            "gpu": asdict(snapshot) if snapshot is not None else None,
            "xids": [asdict(x) for x in tel.xids],
            "xid_sources": tel.xid_sources,
            "paused": ws.watcher.paused,
            "waiting": len(ws.watcher.waiting),
            "phases": {n: v.phase for n, v in views.items() if v.phase},
            "inputs": {n: [v.input_form, list(v.inputs)] for n, v in views.items() if v.inputs},
            # Where clients reach the models, shown under the models table.
            "http_url": _http_url(session.front_ends),
            "generators": [n for n, h in session.models.items() if h.model.generator],
        }, []

    async def pause(header: dict[str, Any], payload: Any) -> Reply:
        paused = header.get("paused")
        if not isinstance(paused, bool):
            raise BadRequestError("pause needs 'paused': true or false")
        if paused:
            ws.watcher.pause()
        else:
            await ws.watcher.resume()
        return {"ok": True, "paused": ws.watcher.paused}, []

    async def rewarm(header: dict[str, Any], payload: Any) -> Reply:
        return {"ok": True, **(await session.rewarm(header.get("model")))}, []

    def _index(header: dict[str, Any]) -> int:
        index = header.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise BadRequestError(f"'index' must be a GPU index (0, 1, ...), got {index!r}")
        return index

    async def reset_check(header: dict[str, Any], payload: Any) -> Reply:
        # May run sudo and nvidia-smi: a thread, never the event loop.
        decision = await asyncio.to_thread(ws.check_reset, _index(header))
        return {"ok": True, "decision": asdict(decision)}, []

    async def reset_gpu(header: dict[str, Any], payload: Any) -> Reply:
        result = await asyncio.to_thread(ws.reset, _index(header))
        return {"ok": True, "result": asdict(result)}, []

    session.handlers.update(
        {
            "dashboard": dashboard,
            "pause": pause,
            "rewarm": rewarm,
            "reset_check": reset_check,
            "reset_gpu": reset_gpu,
        }
    )
    session.endpoint.stream_handlers["events"] = events

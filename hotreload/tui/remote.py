"""`RemoteSource`: the dashboard's view of a `hotreload watch` session in another process.

The dashboard draws in its own process, so Textual's repaints never run on the manager's
event loop or hold its GIL while requests are being routed. Everything travels over the
session's client socket (`hotreload.commands.dashboard_ops`): one `events` subscription, one
`dashboard` call per sample, and an op per key.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.client import AsyncClient, Client
from hotreload.engine.event_kinds import BaseEvent, SessionLost
from hotreload.engine.events import typed
from hotreload.engine.model import PhaseFailed, ReloadOutcome
from hotreload.errors import BadRequestError, HotreloadError, NoServerError
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.reset import ResetDecision, ResetResult
from hotreload.gpu.xid_events import XidEvent
from hotreload.protocol.framing import Frame
from hotreload.tui.source import Clock, Sample, WallClock

#: How long `start()` keeps trying to reach a session whose socket is not there yet.
CONNECT_TIMEOUT_S = 15.0
#: Blocking calls (the GPU reset check may run sudo and nvidia-smi) give up after this.
RESET_CALL_TIMEOUT_S = 120.0


def short_path(path: str | os.PathLike[str]) -> str:
    """The path relative to the working directory when it is below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _not_a_watch_session(exc: BadRequestError) -> HotreloadError:
    if "unknown op" in str(exc):
        return HotreloadError(
            "this session does not serve the dashboard (it was started with `hotreload serve`); "
            "run `hotreload watch` to get one"
        )
    return exc


class RemoteSource:
    """A `DashboardSource` over the session's socket."""

    def __init__(self, socket_path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.clock: Clock = clock or WallClock()
        self.title = str(socket_path)
        self.reset_mode = "never"
        self._client = AsyncClient(socket_path=self.socket_path)
        self._subscribers: list[Callable[[BaseEvent, bool], None]] = []
        self._inputs: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Attach: subscribe to the events, then wait until the session finished its start.
        Raises PhaseFailed when a model could not come up (the session keeps watching)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while True:
            try:
                await self._client.subscribe({"op": "events"}, self._on_frame)
                break
            except NoServerError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        while True:
            reply = await self._call({"op": "dashboard"})
            state = reply.get("start_state")
            if state == "started":
                return
            if state == "failed":
                err = reply.get("start_error") or {}
                raise PhaseFailed(str(err.get("phase")), str(err.get("error")))
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Detach. The session itself is stopped by whoever started it (`hotreload watch`
        stops it when its dashboard exits)."""
        if not self._closed:
            self._closed = True
            await self._client.close()

    def _on_frame(self, frame: Frame | None) -> None:
        if frame is None:
            if not self._closed:
                self._publish(SessionLost(ts=self.clock.now()), False)
            return
        # The wire dict back into its class: the app handles one kind of thing. A kind this
        # dashboard does not know (a newer session's) has nothing to show.
        wire = frame.header.get("event")
        event = typed(wire) if isinstance(wire, dict) else None
        if event is not None:
            self._publish(event, bool(frame.header.get("replayed")))

    def _publish(self, event: BaseEvent, replayed: bool) -> None:
        for fn in list(self._subscribers):
            fn(event, replayed)

    def subscribe(self, fn: Callable[[BaseEvent, bool], None]) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    async def _call(self, header: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        try:
            return (await self._client.call(header, timeout_s=timeout_s)).header
        except BadRequestError as exc:
            raise _not_a_watch_session(exc) from None

    # ------------------------------------------------------------------ data

    async def sample(self) -> Sample:
        r = await self._call({"op": "dashboard"}, timeout_s=30.0)
        self.title = short_path(r["config"])
        self.reset_mode = r["reset_mode"]
        self._inputs = {name: (form, sig) for name, (form, sig) in r["inputs"].items()}
        return Sample(
            taken_at=self.clock.now(),
            models=tuple(r["models"]),
            reloads=tuple(ReloadOutcome(**o) for o in r["reloads"]),
            gpu=GpuSnapshot.from_dict(r["gpu"]) if r["gpu"] is not None else None,
            xids=tuple(XidEvent.from_dict(x) for x in r["xids"]),
            xid_sources=tuple(r["xid_sources"]),
            paused=bool(r["paused"]),
            waiting=int(r.get("waiting") or 0),
            phases=dict(r["phases"]),
            http_url=r.get("http_url"),
            generators=tuple(r.get("generators") or ()),
            socket=short_path(self.socket_path),
        )

    # ------------------------------------------------------------------ keys

    async def reload(self, model: str | None) -> list[ReloadOutcome]:
        # A key pressed on purpose builds even when nothing changed (`hotreload reload
        # --force`): the way to rebuild a model whose build reads what is not watched.
        r = await self._call({"op": "reload", "model": model, "trigger": "key", "force": True})
        return [ReloadOutcome(**o) for o in r["outcomes"]]

    async def rewarm(self, model: str) -> dict[str, Any]:
        return await self._call({"op": "rewarm", "model": model})

    async def rollback(self, model: str) -> list[ReloadOutcome]:
        r = await self._call({"op": "rollback", "model": model})
        return [ReloadOutcome(**o) for o in r["outcomes"]]

    async def set_paused(self, paused: bool) -> None:
        await self._call({"op": "pause", "paused": paused})

    def _blocking_call(self, header: dict[str, Any]) -> dict[str, Any]:
        # Called from a thread worker: a connection of its own, closed when done.
        with Client(socket_path=self.socket_path, timeout_s=RESET_CALL_TIMEOUT_S) as client:
            return client.call(header).header

    def check_reset(self, index: int) -> ResetDecision:
        d = self._blocking_call({"op": "reset_check", "index": index})["decision"]
        return ResetDecision(
            **{**d, "blocking_pids": tuple(d["blocking_pids"]), "command": tuple(d["command"])}
        )

    def reset(self, index: int) -> ResetResult:
        return ResetResult(**self._blocking_call({"op": "reset_gpu", "index": index})["result"])

    def load_targets(self) -> tuple[str, dict[str, tuple[str, list[dict[str, Any]]]]]:
        return str(self.socket_path), dict(self._inputs)

"""`.hotreload/stats.jsonl`: request latency and queue depth over time, and each model's
memory after every reload, for `hotreload report`.

Kept apart from events.jsonl on purpose: one line a second would push the bring-up and the
reloads out of the event replay a dashboard attaches with. It reads the routers without
resetting anything (the dashboard's queue peak is its own) and asks a worker for its memory
only after a reload, when the figure says something.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hotreload.engine.event_kinds import BaseEvent, Ready, ReloadDone
from hotreload.engine.stats import percentile
from hotreload.errors import HotreloadError
from hotreload.paths import open_private

if TYPE_CHECKING:
    from hotreload.engine.events import EventBus
    from hotreload.engine.model import ModelSupervisor


class RecordedSession(Protocol):
    """What the recorder reads of a session (a `Session`): its models and its events. A
    protocol, not the class, so that this module and session.py import one way."""

    @property
    def events(self) -> EventBus: ...

    @property
    def models(self) -> Mapping[str, ModelSupervisor]: ...


STATS_FILE = "stats.jsonl"
#: One line per model this often while requests flow; IDLE_S apart when none do.
INTERVAL_S = 1.0
IDLE_S = 10.0


class StatsRecorder:
    def __init__(
        self, session: RecordedSession, folder: Path, interval_s: float = INTERVAL_S
    ) -> None:
        self.session = session
        self.path = folder / STATS_FILE
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._memory_tasks: set[asyncio.Task[None]] = set()
        self._unsubscribe = session.events.subscribe(self._on_event)
        self._failed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="stats-log")

    async def stop(self) -> None:
        self._unsubscribe()
        for task in [self._task, *self._memory_tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _loop(self) -> None:
        last = time.monotonic()
        idle_for = 0.0
        while True:
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            rows = [
                self._row(name, host.router, last) for name, host in self.session.models.items()
            ]
            last = now
            busy = any(r["count"] or r["queue_depth"] or r["inflight"] for r in rows)
            idle_for = 0.0 if busy else idle_for + self.interval_s
            if busy or idle_for >= IDLE_S:
                idle_for = 0.0
                self._write(rows)

    def _row(self, name: str, router: Any, since: float) -> dict[str, Any]:
        # Latencies recorded since the last row: a reload's spike is not averaged into the
        # 60 s window the dashboard shows.
        values = sorted(router.latency.since(since))
        return {
            "ts": time.time(),
            "kind": "stats",
            "model": name,
            "count": len(values),
            "p50_ms": round(percentile(values, 50), 3),
            "p99_ms": round(percentile(values, 99), 3),
            "queue_depth": router.depth,
            "inflight": router.inflight,
        }

    def _on_event(self, event: BaseEvent) -> None:
        if not isinstance(event, (Ready, ReloadDone)):
            return
        host = self.session.models.get(event.model)
        if host is None:
            return
        task = asyncio.get_running_loop().create_task(self._memory(host, event.version))
        self._memory_tasks.add(task)
        task.add_done_callback(self._memory_tasks.discard)

    async def _memory(self, host: Any, version: int) -> None:
        await asyncio.sleep(0.2)  # the old version's release settles first
        try:
            status = await host.worker_status(max_age_s=0.0)
        except Exception:
            return  # the worker went away: no figure, nothing to say
        alloc = (status.allocator if status is not None else None) or {}
        self._write(
            [
                {
                    "ts": time.time(),
                    "kind": "memory",
                    "model": host.name,
                    "version": version,
                    "rss_bytes": status.rss_bytes if status is not None else None,
                    "allocated_bytes": alloc.get("allocated_bytes"),
                }
            ]
        )

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if self._failed:
            return
        try:
            # Private like every state file (0600, no link followed): it names the models.
            fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        except (OSError, HotreloadError):
            self._failed = True  # a full disk: the report lacks figures, serving goes on

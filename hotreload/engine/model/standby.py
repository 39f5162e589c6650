"""The standby worker (strategy respawn): a process started ahead of time, or the one a
reload retired, waiting to build the next version.

It is started in the background after a job, so its start never competes with a build,
and at idle priority. A worker kept after a swap, or after a build that failed in the
user's code, takes the place of one still starting.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from hotreload.engine.event_kinds import StandbyFailed, StandbyReady
from hotreload.engine.model.built import Retired
from hotreload.engine.model.state import ModelState
from hotreload.engine.model.workers import WorkerFactory
from hotreload.engine.snapshots import code_paths
from hotreload.engine.worker_port import Worker


class StandbyKeeper:
    def __init__(self, st: ModelState, workers: WorkerFactory, root: Path, strategy: Any) -> None:
        self.st = st
        self.workers = workers
        self.root = root
        #: Its `wants_standby` says whether the model keeps one.
        self.strategy = strategy
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start_soon(self) -> None:
        """Start the next standby in the background, if the strategy wants one and none
        waits or starts."""
        if (
            self._closed
            or not self.strategy.wants_standby
            or self.st.record.standby is not None
            or (self._task is not None and not self._task.done())
        ):
            return
        self._task = asyncio.create_task(self._start(), name=f"standby-{self.st.name}")

    async def _start(self) -> None:
        try:
            current = self.st.record.current
            worker = await self.workers.spawn(
                code_paths(self.st.model, self.root),
                standby=True,
                preimport=current.libraries if current is not None else (),
            )
        except Exception as exc:
            # Not fatal: the next reload spawns a worker as if there were no standby.
            self.st.events.emit(StandbyFailed(model=self.st.name, error=str(exc)))
            return
        if self._closed:
            await worker.end()
            return
        self.st.set_standby(worker)
        self.st.events.emit(StandbyReady(model=self.st.name, pid=worker.pid, recycled=0))

    async def take(self) -> Worker | None:
        """The standby for this reload, or None. One still starting (at low priority) is
        left for the next reload: a fresh spawn at normal priority is quicker now."""
        worker = self.st.set_standby(None)
        if worker is not None and not worker.alive:
            await worker.end()
            return None
        return worker

    async def keep(self, worker: Worker, recycled: int, after: str) -> None:
        """`worker` (its versions dropped) is the next standby, in place of one starting."""
        await self._cancel_start()  # a fresh one still importing is not needed now
        if self._closed or self.st.record.standby is not None:
            await worker.end(self.st.model.deadlines.stop_s)
            return
        worker.recycled = recycled
        self.st.set_standby(worker)
        self.st.events.emit(
            StandbyReady(model=self.st.name, pid=worker.pid, recycled=recycled, after=after)
        )

    async def keep_retired(self, retired: Retired | None) -> None:
        """The old worker a swap retired, kept as the next standby when the strategy says."""
        if retired is not None and retired.standby is not None:
            await self.keep(retired.standby, retired.recycled, after="serving")

    async def discard(self) -> None:
        """The model's settings changed: the standby (or one starting) was started with the
        old ones. The next one starts after the job, with the new."""
        await self._cancel_start()
        worker = self.st.set_standby(None)
        if worker is not None:
            await worker.end(self.st.model.deadlines.stop_s)

    async def _cancel_start(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        """Session shutdown: no new standby, and the one waiting is stopped."""
        self._closed = True
        await self.discard()

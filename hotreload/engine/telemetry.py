"""GPU telemetry for a session: the NVML sampler and the Xid monitor from the GPU layer,
bridged onto the event loop.

Readings arrive on the layer's own threads and are handed to the loop with
`call_soon_threadsafe`; nothing here calls NVML on the loop. Without an NVIDIA GPU the
sampler publishes one snapshot saying why, and the Xid monitor reports its sources as
inactive (and why); the session goes on serving on the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

from hotreload.engine.event_kinds import GpuUnavailable, Xid, XidSources
from hotreload.engine.events import EventBus

#: Read the kernel log from this path instead (tests point it at a FIFO).
KMSG_ENV = "HOTRELOAD_KMSG_PATH"


class GpuTelemetry:
    def __init__(
        self,
        events: EventBus,
        *,
        own_pids: Callable[[], Collection[int]],
        phase_of: Callable[[], str | None],
        interval_s: float = 0.5,
        watch_xids: bool = True,
    ) -> None:
        self.events = events
        self.own_pids = own_pids
        self.phase_of = phase_of
        self.interval_s = interval_s
        self.watch_xids = watch_xids
        #: The latest `hotreload.gpu.nvml.GpuSnapshot` (None until the first reading).
        self.snapshot: Any = None
        #: Xid events seen this session (most recent last).
        self.xids: deque[Any] = deque(maxlen=500)
        self._sampler: Any = None
        self._monitor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        # Imported here: the GPU layer loads pynvml lazily, but only sessions need it.
        from hotreload.gpu.sampler import GpuSampler
        from hotreload.gpu.xid import XidMonitor

        self._loop = asyncio.get_running_loop()
        self._sampler = GpuSampler(
            self._from_thread(self._on_snapshot), self.interval_s, self.own_pids
        )
        self._sampler.start()
        if self.watch_xids:
            kmsg = os.environ.get(KMSG_ENV)
            options: dict[str, Any] = (
                {"kmsg_path": kmsg, "kernel_log_method": "kmsg"} if kmsg else {}
            )
            self._monitor = XidMonitor(self._from_thread(self._on_xid), self.phase_of, **options)
            self._monitor.start()
            await asyncio.to_thread(self._monitor.wait_ready, 3.0)
            self.events.emit(XidSources(sources=self.xid_sources))

    def _from_thread(self, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        def call(value: Any) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(fn, value)

        return call

    def _on_snapshot(self, snapshot: Any) -> None:
        first = self.snapshot is None
        self.snapshot = snapshot
        if first and not snapshot.available:
            self.events.emit(GpuUnavailable(reason=snapshot.reason))

    def _on_xid(self, event: Any) -> None:
        from hotreload.gpu.xid import event_to_json

        self.xids.append(event)
        self.events.emit(Xid(**event_to_json(event)))

    @property
    def xid_sources(self) -> list[dict[str, Any]]:
        if self._monitor is None:
            return []
        return [
            {"name": s.name, "active": s.active, "reason": s.reason} for s in self._monitor.sources
        ]

    async def stop(self) -> None:
        for part in (self._sampler, self._monitor):
            if part is not None:
                await asyncio.to_thread(part.stop, 2.0)


def describe_xid_sources(
    sources: Iterable[dict[str, Any]], clean: Callable[[str], str] = str
) -> str:
    """`nvml off (why); kmsg on`: each Xid source, and why an inactive one is off."""
    return "; ".join(
        f"{s['name']} {'on' if s['active'] else 'off'}"
        + ("" if s["active"] else f" ({clean(str(s['reason']))})")
        for s in sources
    )

"""`GpuSampler`: NVML readings on one long-lived thread, handed to a callback.

The engine's telemetry runs one; every reading is a frozen `GpuSnapshot`, so consumers never
reach the hardware. Readings go through the process-wide gateway (`nvml.gateway()`) unless
one is given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from hotreload.gpu.nvml import NvmlGateway, gateway
from hotreload.gpu.readings import GpuSnapshot

log = logging.getLogger(__name__)


class GpuSampler:
    """Takes a reading every `interval_s` on one thread and hands it to `on_snapshot`.

    Readings never overlap: the next one is scheduled from the start of the previous one and
    skipped ahead if a reading overran. Without NVML it publishes one snapshot saying why,
    then only re-checks every `retry_interval_s`, publishing again only if that changes.
    """

    def __init__(
        self,
        on_snapshot: Callable[[GpuSnapshot], None],
        interval_s: float = 0.5,
        own_pids: Callable[[], Collection[int]] = tuple,
        *,
        retry_interval_s: float = 10.0,
        nvml: NvmlGateway | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._on_snapshot = on_snapshot
        self._interval_s = interval_s
        self._own_pids = own_pids
        self._retry_interval_s = retry_interval_s
        self._gateway = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: GpuSnapshot | None = None
        self.readings = 0

    @property
    def latest(self) -> GpuSnapshot | None:
        """The most recent snapshot published, or None before the first."""
        return self._latest

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._thread = threading.Thread(target=self._run, name="hotreload-gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 2.0) -> bool:
        """Stop and join; True when the thread ended within `timeout`."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _read(self) -> GpuSnapshot:
        gw = self._gateway or gateway()
        try:
            own = self._own_pids()
        except Exception:
            log.exception("own_pids callback failed")
            own = ()
        return gw.snapshot(own)

    def _publish(self, snap: GpuSnapshot) -> None:
        self._latest = snap
        try:
            self._on_snapshot(snap)
        except Exception:  # a consumer's bug must not stop the telemetry
            log.exception("on_snapshot callback failed")

    def _run(self) -> None:
        published_reason: tuple[bool, str | None] | None = None
        next_at = time.monotonic()
        while not self._stop.is_set():
            snap = self._read()
            self.readings += 1
            key = (snap.available, snap.reason_kind)
            if snap.available or key != published_reason:
                self._publish(snap)
                published_reason = key
            period = self._interval_s if snap.available else self._retry_interval_s
            next_at += period
            now = time.monotonic()
            if next_at < now:  # a reading overran: skip the missed ticks rather than burst
                next_at = now + period if not snap.available else now
            self._stop.wait(max(next_at - now, 0.0))

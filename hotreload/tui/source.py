"""The one seam between the dashboard and the engine: a `DashboardSource`.

`SessionSource` wraps a real `WatchSession` on the app's own event loop; the scripted
source (`hotreload.tui.scripted`) replays fixed data on a fixed clock for snapshot tests
and screenshots. The app is the same either way: it only talks to this protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hotreload.engine.events import Event
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.xid_events import XidEvent

if TYPE_CHECKING:
    from hotreload.config import Config
    from hotreload.engine.reloader import ReloadOutcome
    from hotreload.engine.watch import WatchSession
    from hotreload.gpu.reset import ResetDecision, ResetResult


class Clock(Protocol):
    """Time for the dashboard: `now()` (epoch seconds) and how to print a moment."""

    def now(self) -> float: ...

    def hms(self, ts: float) -> str: ...


class WallClock:
    def now(self) -> float:
        return time.time()

    def hms(self, ts: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(ts))


@dataclass(frozen=True)
class Sample:
    """Everything one turn of the sampling loop read; widgets render only from these."""

    taken_at: float
    #: `Session.status()["models"]`: one dict per model, in config order.
    models: tuple[dict[str, Any], ...]
    #: Every model's reload outcomes, oldest first.
    reloads: tuple[ReloadOutcome, ...]
    #: The latest NVML reading (None until the first one arrives).
    gpu: GpuSnapshot | None
    xids: tuple[XidEvent, ...]
    #: [{"name", "active", "reason"}] per Xid source.
    xid_sources: tuple[dict[str, Any], ...] = ()
    paused: bool = False
    #: model -> the reload phase running now.
    phases: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ResetTarget:
    """Which GPU a reset of the selected model's device would hit, or why there is none."""

    index: int | None
    reason: str | None = None


def reset_target(model: dict[str, Any] | None, gpu: GpuSnapshot | None) -> ResetTarget:
    """The GPU behind `model`, or a plain sentence saying why no reset is possible."""
    if gpu is None:
        return ResetTarget(None, "no GPU reading yet; try again in a moment")
    if not gpu.available:
        return ResetTarget(
            None,
            f"No NVIDIA GPU is usable on this machine: {gpu.reason}. A GPU reset only "
            "applies to NVIDIA GPUs, so there is nothing to reset.",
        )
    if model is None:
        return ResetTarget(None, "no model is selected")
    device = str(model.get("device") or "")
    if not device.startswith("cuda"):
        return ResetTarget(
            None,
            f"model {model.get('name')!r} runs on {device or 'an unknown device'}, not on a GPU:"
            " a GPU reset would not help it.",
        )
    return ResetTarget(int(device.split(":", 1)[1]) if ":" in device else 0)


class DashboardSource(Protocol):
    """What the dashboard needs from a session. Blocking calls are marked: run them in a
    thread worker, never in a handler."""

    clock: Clock
    #: Shown in the header (the config path).
    title: str
    #: Config `[gpu] reset` mode: "never", "on-wedge" or "ask".
    reset_mode: str

    async def start(self) -> None:
        """Bring every model up; raises BringUpError (after starting the watcher anyway)."""

    async def stop(self) -> None:
        """Drain and stop every worker. Idempotent."""

    async def sample(self) -> Sample: ...

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]: ...

    async def reload(self, model: str | None) -> list[ReloadOutcome]:
        """Reload one model (None: every model) and return the outcomes."""

    async def rewarm(self, model: str) -> dict[str, Any]: ...

    async def set_paused(self, paused: bool) -> None: ...

    def check_reset(self, index: int) -> ResetDecision:
        """Blocking (may run subprocesses): call from a thread."""

    def reset(self, index: int) -> ResetResult:
        """Blocking: call from a thread."""

    def load_targets(self) -> tuple[str, dict[str, tuple[str, list[dict[str, Any]]]]]:
        """(socket path, {model: (input form, input signature)}) for the load generator."""


def _short_path(path: Any) -> str:
    """The config path relative to the working directory when it is below it."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


class SessionSource:
    """A real `WatchSession` (session + file watcher) on the running event loop."""

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        from hotreload.engine.watch import WatchSession

        self.config = config
        self.clock: Clock = clock or WallClock()
        self.title = _short_path(config.path)
        self.reset_mode = config.gpu.reset
        self.ws: WatchSession = WatchSession(config)
        self._stop_task: asyncio.Task[None] | None = None

    @property
    def session(self) -> Any:
        return self.ws.session

    async def start(self) -> None:
        from hotreload.engine.host import BringUpError

        failure: BringUpError | None = None
        try:
            await self.ws.session.start()
        except BringUpError as exc:
            failure = exc
        # Watch even after a failed start: the user fixes the file, saves, and it comes up.
        await self.ws.watcher.start()
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        # One stop for every caller, shielded: a caller cancelled mid-way (the app closing)
        # must not cut the drain short and leave a worker behind.
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stop_task)

    async def _stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.stop()

    async def sample(self) -> Sample:
        s = self.ws.session
        # Router figures every sample; the worker's RSS and allocator every 2 s are enough.
        status = await s.status(worker_max_age_s=2.0)
        reloads = tuple(o for r in s.reloaders.values() for o in r.history)
        tel = s.telemetry
        return Sample(
            taken_at=self.clock.now(),
            models=tuple(status["models"]),
            reloads=tuple(sorted(reloads, key=lambda o: o.started_at)),
            gpu=s.gpu_snapshot,
            xids=tuple(tel.xids),
            xid_sources=tuple(tel.xid_sources),
            paused=self.ws.watcher.paused,
            phases={n: h.reload_phase for n, h in s.hosts.items() if h.reload_phase},
        )

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        return self.ws.session.events.subscribe(fn)

    async def reload(self, model: str | None) -> list[ReloadOutcome]:
        if model is None:
            return await self.ws.session.reload_all(trigger="key")
        return [await self.ws.session.reload_model(model, trigger="key")]

    async def rewarm(self, model: str) -> dict[str, Any]:
        return await self.ws.session.rewarm(model)

    async def set_paused(self, paused: bool) -> None:
        if paused:
            self.ws.watcher.pause()
        else:
            await self.ws.watcher.resume()

    def _pids_on(self, index: int) -> list[int]:
        pids = []
        for host in self.ws.session.hosts.values():
            w = host.worker
            if w is not None and w.pid and (w.device or "").startswith(f"cuda:{index}"):
                pids.append(w.pid)
        return pids

    def check_reset(self, index: int) -> ResetDecision:
        from hotreload.gpu.reset import check_reset

        xids = list(self.ws.session.telemetry.xids)
        return check_reset(index, self._pids_on(index), xids, allow=self.reset_mode != "never")

    def reset(self, index: int) -> ResetResult:
        from hotreload.gpu.reset import reset_gpu

        xids = list(self.ws.session.telemetry.xids)
        return reset_gpu(index, self._pids_on(index), xids, allow=self.reset_mode != "never")

    def load_targets(self) -> tuple[str, dict[str, tuple[str, list[dict[str, Any]]]]]:
        targets = {
            name: (h.router.input_form, list(h.router.input_signature))
            for name, h in self.ws.session.hosts.items()
            if h.router.input_signature
        }
        return str(self.ws.session.socket_path), targets

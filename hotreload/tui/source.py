"""The one seam between the dashboard and the engine: a `DashboardSource`.

`RemoteSource` (`hotreload.tui.remote`) talks to a `hotreload watch` session in another
process over its socket; the scripted source (`tests.scripted_source`) replays fixed data
on a fixed clock for snapshot tests and screenshots. The app is the same either way: it
only talks to this protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hotreload.engine.event_kinds import BaseEvent
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.xid_events import XidEvent

if TYPE_CHECKING:
    from hotreload.engine.model import ReloadOutcome
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
    #: While paused: how many files differ from what is loaded (reloaded on resume).
    waiting: int = 0
    #: model -> the reload phase running now.
    phases: dict[str, str] = field(default_factory=dict)
    #: How clients reach the session: its HTTP base URL (None without --http / [http]),
    #: the text generators among its models (they serve completions too), its socket.
    http_url: str | None = None
    generators: tuple[str, ...] = ()
    socket: str = ""


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
        """Bring every model up; raises PhaseFailed (after starting the watcher anyway)."""

    async def stop(self) -> None:
        """Detach from the session. Idempotent."""

    async def sample(self) -> Sample: ...

    def subscribe(self, fn: Callable[[BaseEvent, bool], None]) -> Callable[[], None]:
        """Call `fn(event, replayed)` for each event of the session; `replayed` is True for
        the history from before the dashboard attached."""

    async def reload(self, model: str | None) -> list[ReloadOutcome]:
        """Reload one model (None: every model) and return the outcomes."""

    async def rewarm(self, model: str) -> dict[str, Any]: ...

    async def rollback(self, model: str) -> list[ReloadOutcome]:
        """Serve the model's version before the serving one again (`hotreload rollback`)."""

    async def set_paused(self, paused: bool) -> None: ...

    def check_reset(self, index: int) -> ResetDecision:
        """Blocking (may run subprocesses): call from a thread."""

    def reset(self, index: int) -> ResetResult:
        """Blocking: call from a thread."""

    def load_targets(self) -> tuple[str, dict[str, tuple[str, list[dict[str, Any]]]]]:
        """(socket path, {model: (input form, input signature)}) for the load generator."""

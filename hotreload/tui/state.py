"""What the dashboard remembers between samples: short histories, memory baselines and the
reloads running now. Plain Python, no widgets: the app feeds it samples and events."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hotreload.engine.event_kinds import (
    BaseEvent,
    LockWait,
    PhaseEnd,
    PhaseStart,
    Ready,
    ReloadDone,
    ReloadFailed,
    ReloadRequested,
    StartFailed,
    State,
)
from hotreload.tui.source import Sample

#: Points kept per history: 240 samples at the default 0.5 s is the last 2 minutes.
HISTORY_POINTS = 240


@dataclass
class LiveReload:
    """A reload in progress, built from phase events until its outcome arrives."""

    model: str
    trigger: str
    started_at: float
    detail: str | None = None
    phase: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    #: When the running phase started (its elapsed time ticks in the Reloads panel).
    phase_started_at: float | None = None


@dataclass(frozen=True)
class Baseline:
    """A model's memory figure at its first load: growth is measured against it."""

    version: int
    value: int
    #: "allocated" (torch's CUDA allocator) or "rss" (host memory of the worker).
    kind: str


def memory_figure(model: dict[str, Any]) -> tuple[str, int] | None:
    """The figure a leak shows in: allocated CUDA memory, else the worker's RSS."""
    worker = model.get("worker") or {}
    alloc = worker.get("allocator")
    if alloc and alloc.get("allocated_bytes") is not None:
        return "allocated", int(alloc["allocated_bytes"])
    if worker.get("rss_bytes") is not None:
        return "rss", int(worker["rss_bytes"])
    return None


class DashboardState:
    def __init__(self, history_points: int = HISTORY_POINTS) -> None:
        self.sample: Sample | None = None
        self.history_points = history_points
        self.queue: dict[str, deque[int]] = {}
        self.p99: dict[str, deque[float]] = {}
        self.baselines: dict[str, Baseline] = {}
        self.live: dict[str, LiveReload] = {}
        #: model -> the start_failed event (error and traceback of a failed first start).
        self.start_errors: dict[str, StartFailed] = {}
        #: model -> when it entered its current state (a "loading" shows how long so far).
        self.state_since: dict[str, float] = {}

    def model(self, name: str | None) -> dict[str, Any] | None:
        if self.sample is None:
            return None
        for m in self.sample.models:
            if m.get("name") == name:
                return m
        return None

    def names(self) -> list[str]:
        return [m["name"] for m in self.sample.models] if self.sample else []

    def _zeros(self, zero: Any) -> deque[Any]:
        return deque([zero] * self.history_points, maxlen=self.history_points)

    def update(self, sample: Sample, points: int = 1) -> None:
        """Take a sample; it adds `points` to each history (one per refresh period)."""
        self.sample = sample
        for m in sample.models:
            name = m["name"]
            # Histories start full of zeros: a sparkline keeps its width from the first
            # sample, and an idle one stays the same text (no repaint while nothing happens).
            q = self.queue.setdefault(name, self._zeros(0))
            # The peak since the last sample: a burst between two samples still shows.
            q.extend([int(m.get("queue_peak", m.get("queue_depth")) or 0)] * points)
            lat = m.get("latency") or {}
            p = self.p99.setdefault(name, self._zeros(0.0))
            p.extend([float(lat.get("p99_ms") or 0.0)] * points)
            fig = memory_figure(m)
            serving = m.get("state") == "serving" and int(m.get("version") or 0) >= 1
            # A respawned worker or a CUDA figure appearing late starts a fresh baseline.
            base = self.baselines.get(name)
            if fig and serving and (base is None or base.kind != fig[0]):
                self.baselines[name] = Baseline(int(m["version"]), fig[1], fig[0])
        # A reload the history already holds is no longer "live".
        for outcome in sample.reloads:
            live = self.live.get(outcome.model)
            if live is not None and outcome.started_at >= live.started_at:
                self.live.pop(outcome.model, None)

    def growth(self, model: dict[str, Any]) -> tuple[int, Baseline] | None:
        base = self.baselines.get(model["name"])
        fig = memory_figure(model)
        if base is None or fig is None or fig[0] != base.kind:
            return None
        return fig[1] - base.value, base

    def on_event(self, event: BaseEvent) -> None:
        ts = event.ts
        match event:
            case State(model=model):
                self.state_since[model] = ts
            case ReloadRequested(model=model, trigger=trigger, detail=detail):
                if model not in self.live:
                    self.live[model] = LiveReload(model, trigger or "?", ts, detail)
            case PhaseStart(model=model, phase=phase):
                # A follow-up reload queued behind another one starts without its own request.
                live = self.live.setdefault(model, LiveReload(model, "queued", ts))
                live.phase, live.phase_started_at = phase, ts
            case LockWait(model=model):
                # Shown as the running phase until the lock comes (who holds it: a toast).
                live = self.live.setdefault(model, LiveReload(model, "queued", ts))
                live.phase, live.phase_started_at = "lock", ts
            case PhaseEnd(model=model, phase=phase, duration_s=duration):
                if model in self.live:
                    self.live[model].phases[phase] = float(duration or 0.0)
            case ReloadDone(model=model):
                self.live.pop(model, None)
                self.start_errors.pop(model, None)  # a cold start after a failed one
            case ReloadFailed(model=model):
                self.live.pop(model, None)
            case StartFailed(model=model) as failed:
                self.start_errors[model] = failed
            case Ready(model=model):
                self.start_errors.pop(model, None)


def activity(sample: Sample) -> tuple[Any, ...]:
    """What moves when the session is busy: requests, queues, states, reloads, Xids. Two
    samples with the same activity mean an idle session (the sampler slows down)."""
    models = tuple(
        (
            m.get("state"),
            m.get("version"),
            m.get("queue_depth"),
            m.get("queue_peak"),
            m.get("inflight"),
            tuple(sorted((m.get("requests") or {}).items())),
        )
        for m in sample.models
    )
    reloads, xids = len(sample.reloads), len(sample.xids)
    return (models, reloads, xids, sample.paused, sample.waiting, tuple(sample.phases))

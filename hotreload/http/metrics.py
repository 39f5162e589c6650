"""Prometheus metrics for a session, served at `GET /metrics`.

Figures the engine already keeps (queue depth, in flight, request counters, version, state,
restarts, load and warm-up times, GPU readings) are read at scrape time by a custom
collector, so nothing is copied on the request path. What only exists as a stream (reload
phases and outcomes, Xid events) is counted from the event bus, and request and queue
latencies are counted into histogram buckets as the router records them (plain numbers,
exposed at scrape time as prometheus_client's `Histogram` exposes them).

Each session has its own `CollectorRegistry`: two sessions in one process (tests) never
share series, and nothing leaks into the global registry of an embedding program.

Triton-compatible aliases (`nv_*`) repeat the few series Triton dashboards read, under
Triton's names and labels (`model`, `version`). Triton exposes its counters without a
`_total` suffix, which a typed counter cannot have, so the counter aliases are untyped.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.utils import floatToGoString

from hotreload.engine.event_kinds import BaseEvent, PhaseEnd, ReloadDone, ReloadFailed, Xid
from hotreload.engine.model import STATES
from hotreload.engine.stats import LatencyWindow

if TYPE_CHECKING:
    from hotreload.engine.model import ModelSupervisor
    from hotreload.engine.session import Session

#: Every state a host reports; `hotreload_model_state` has one series per state (0 or 1).
MODEL_STATES = STATES
#: States in which a model that has served a version still cannot take requests.
NOT_SERVING_STATES = frozenset(
    {"starting", "restarting", "failed", "wedged", "stopped", "unloaded"}
)

REQUEST_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


def model_ready(host: ModelSupervisor) -> tuple[bool, str]:
    """(ready, why not): ready once a version has finished warm-up and the host can serve.

    A reload in progress keeps the model ready: the old version serves until the swap.
    """
    view = host.view
    if not view.has_version or view.version == 0:
        return False, f"model {view.name!r} is {view.state}; no version has finished warm-up yet"
    if view.state in NOT_SERVING_STATES:
        return False, f"model {view.name!r} is {view.state}"
    return True, ""


@dataclass(eq=False)
class ObservedLatencyWindow(LatencyWindow):
    """The router's latency window, also observing each sample into a histogram.

    The router records every request's latency (socket and HTTP alike) in its windows, so
    teeing them gives histograms of all traffic without a hook on the request path.
    """

    observe: Callable[[float], None] | None = None

    def add(self, latency_ms: float, now: float | None = None) -> None:
        super().add(latency_ms, now)
        if self.observe is not None:
            self.observe(latency_ms)


class _Latencies:
    """One model's series of a `LatencyHistogram`: a count per bucket and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe_ms(self, latency_ms: float) -> None:
        seconds = latency_ms / 1000
        # The first bucket whose bound is >= the value, as prometheus_client's `observe`.
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds


class LatencyHistogram:
    """A histogram of latencies by model, counted in plain numbers on the request path and
    exposed at scrape time with the series, labels and values prometheus_client's
    `Histogram` gives (`_bucket`, `_count`, `_sum`, `_created`). Observing into a
    `Histogram` took a lock per figure and a Python loop over its buckets, twice a request;
    here it is a bisect and two additions (the event loop is the one writer and reader)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in (*self.bounds, float("inf"))]
        self._series: dict[str, _Latencies] = {}

    def labels(self, model: str) -> _Latencies:
        """The model's series (shown from now on, at zero until observed)."""
        series = self._series.get(model)
        if series is None:
            series = self._series[model] = _Latencies(self.bounds)
        return series

    def total_s(self, model: str) -> float:
        """The sum of the model's latencies, in seconds (0 before any)."""
        series = self._series.get(model)
        return series.sum if series is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model"])
        # Read where prometheus_client reads it: `disable_created_metrics()` and the
        # PROMETHEUS_DISABLE_CREATED_SERIES variable leave `_created` out.
        created = getattr(prometheus_metrics, "_use_created", True)
        for model, series in self._series.items():
            totals = [float(n) for n in accumulate(series.counts)]
            family.add_metric([model], list(zip(self._les, totals, strict=True)), series.sum)
            if created:
                family.add_sample(self.name + "_created", {"model": model}, series.created)
        yield family


class SessionMetrics:
    """The registry, the histograms fed by events and requests, and the scrape collector."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.request_seconds = LatencyHistogram(
            "hotreload_request_duration_seconds",
            "Time from admission to reply of successful requests, queue included",
            REQUEST_BUCKETS,
        )
        r.register(self.request_seconds)
        #: Its sum is also Triton's nv_inference_queue_duration_us.
        self.queue_seconds = LatencyHistogram(
            "hotreload_queue_duration_seconds",
            "Time requests waited in the model's queue before reaching the worker",
            REQUEST_BUCKETS,
        )
        r.register(self.queue_seconds)
        self.reload_phase_seconds = Histogram(
            "hotreload_reload_phase_duration_seconds",
            "Duration of each reload phase (load, warm, smoke, gate, drain, sync, swap, ...)",
            ["model", "phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.reload_seconds = Histogram(
            "hotreload_reload_duration_seconds",
            "Duration of whole successful reloads",
            ["model"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.reloads = Counter(
            "hotreload_reloads",
            "Reloads by outcome (success, failed) and trigger (file, http, cli, ...)",
            ["model", "outcome", "trigger"],
            registry=r,
        )
        self.reload_failures = Counter(
            "hotreload_reload_failures",
            "Failed reloads by the phase that failed",
            ["model", "phase"],
            registry=r,
        )
        self.xid_events = Counter(
            "hotreload_gpu_xid_events",
            "NVIDIA Xid events seen by the Xid monitor, by code",
            ["gpu", "code", "name", "severity"],
            registry=r,
        )
        #: Requests the HTTP layer refused before they reached the router (bad JSON, ...).
        self.http_bad_requests: dict[str, int] = {}
        self._restore: list[Callable[[], None]] = []
        r.register(_SessionCollector(self))
        for host in session.models.values():
            self._tee_router(host)
        self._unsubscribe = session.events.subscribe(self.on_event)

    def _tee_router(self, host: ModelSupervisor) -> None:
        name = host.name
        old_latency, old_queue = host.latency_windows()
        host.set_latency_windows(
            ObservedLatencyWindow(
                window_s=old_latency.window_s,
                max_samples=old_latency.max_samples,
                observe=self.request_seconds.labels(name).observe_ms,
            ),
            ObservedLatencyWindow(
                window_s=old_queue.window_s,
                max_samples=old_queue.max_samples,
                observe=self.queue_seconds.labels(name).observe_ms,
            ),
        )

        def restore() -> None:
            for window in host.latency_windows():
                window.observe = None

        self._restore.append(restore)

    def close(self) -> None:
        self._unsubscribe()
        for restore in self._restore:
            restore()
        self._restore.clear()

    def count_bad_request(self, model: str) -> None:
        self.http_bad_requests[model] = self.http_bad_requests.get(model, 0) + 1

    def on_event(self, event: BaseEvent) -> None:
        match event:
            case PhaseEnd(model=model, phase=phase, duration_s=duration, skipped=skipped):
                if not skipped and isinstance(duration, (int, float)):
                    self.reload_phase_seconds.labels(model, phase).observe(duration)
            case ReloadDone(unchanged=str()):
                pass  # nothing was built: no reload to count
            case ReloadDone(model=model, trigger=trigger, total_s=total):
                self.reloads.labels(model, "success", trigger or "unknown").inc()
                if isinstance(total, (int, float)):
                    self.reload_seconds.labels(model).observe(total)
            case ReloadFailed(model=model, trigger=trigger, phase=phase):
                self.reloads.labels(model, "failed", trigger or "unknown").inc()
                self.reload_failures.labels(model, phase or "unknown").inc()
            case Xid() as x:
                # The engine emits `event_to_json(XidEvent)`, which names the index "device".
                self.xid_events.labels(
                    "" if x.device is None else str(x.device),
                    str(x.xid),
                    str(x.name or ""),
                    str(x.severity or ""),
                ).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _SessionCollector:
    """Reads host, router and GPU figures at scrape time."""

    def __init__(self, metrics: SessionMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        session = self.metrics.session
        hosts = list(session.models.values())
        m = ["model"]
        depth = GaugeMetricFamily(
            "hotreload_queue_depth", "Requests waiting in the queue", labels=m
        )
        limit = GaugeMetricFamily("hotreload_queue_limit", "The queue's bound", labels=m)
        inflight = GaugeMetricFamily(
            "hotreload_inflight_requests", "Requests inside the worker", labels=m
        )
        requests = CounterMetricFamily(
            "hotreload_requests",
            "Finished requests by outcome (success, rejected, timed_out, failed) and reason",
            labels=["model", "outcome", "reason"],
        )
        retried = CounterMetricFamily(
            "hotreload_requests_retried", "Requests resent after their worker died", labels=m
        )
        version = GaugeMetricFamily("hotreload_model_version", "Version now serving", labels=m)
        state = GaugeMetricFamily(
            "hotreload_model_state", "1 for the model's current state", labels=["model", "state"]
        )
        ready = GaugeMetricFamily(
            "hotreload_model_ready", "1 when the model takes requests", labels=m
        )
        load = GaugeMetricFamily(
            "hotreload_model_load_seconds", "Load time of the serving version", labels=m
        )
        warm = GaugeMetricFamily(
            "hotreload_model_warmup_seconds", "Warm-up time of the serving version", labels=m
        )
        restarts = CounterMetricFamily(
            "hotreload_worker_restarts", "Workers restarted after dying or wedging", labels=m
        )
        compile_s = GaugeMetricFamily(
            "hotreload_model_compile_seconds",
            "torch.compile time in the serving version's warm phase (compiled models)",
            labels=m,
        )
        serving_compiles = GaugeMetricFamily(
            "hotreload_serving_compiles",
            "Requests whose forward compiled (torch.compile) in the serving worker, as of "
            "its last status read",
            labels=m,
        )
        tv = ["model", "version"]
        nv_pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Triton alias of hotreload_queue_depth",
            labels=tv,
        )
        nv_success = UnknownMetricFamily(
            "nv_inference_request_success",
            "Triton alias (counter): successful requests",
            labels=tv,
        )
        nv_failure = UnknownMetricFamily(
            "nv_inference_request_failure",
            "Triton alias (counter): failed requests; reason REJECTED (queue full or timed "
            "out), BACKEND (model error or worker lost), OTHER (bad request)",
            labels=[*tv, "reason"],
        )
        nv_queue = UnknownMetricFamily(
            "nv_inference_queue_duration_us",
            "Triton alias (counter): cumulative queue time in microseconds",
            labels=tv,
        )
        nv_load = GaugeMetricFamily(
            "nv_model_load_duration_secs",
            "Triton alias: load plus warm-up seconds of the serving version",
            labels=tv,
        )
        for host in hosts:
            view = host.view
            name, c, v = view.name, view.requests, str(view.version)
            depth.add_metric([name], view.queue_depth)
            limit.add_metric([name], view.queue_limit)
            inflight.add_metric([name], view.inflight)
            bad = c["bad_request"] + self.metrics.http_bad_requests.get(name, 0)
            for outcome, reason, value in (
                ("success", "", c["ok"]),
                ("rejected", "queue_full", c["rejected"]),
                ("rejected", "bad_request", bad),
                ("timed_out", "timeout", c["timed_out"]),
                ("failed", "model_error", c["model_error"]),
                ("failed", "unavailable", c["unavailable"]),
            ):
                requests.add_metric([name, outcome, reason], value)
            retried.add_metric([name], c["retried"])
            version.add_metric([name], view.version)
            for s in MODEL_STATES if view.state in MODEL_STATES else (*MODEL_STATES, view.state):
                state.add_metric([name, s], 1.0 if s == view.state else 0.0)
            ready.add_metric([name], 1.0 if model_ready(host)[0] else 0.0)
            if view.has_version:
                load.add_metric([name], view.load_s)
                warm.add_metric([name], view.warm_s)
                nv_load.add_metric([name, v], view.load_s + view.warm_s)
            restarts.add_metric([name], view.restarts)
            figures = host.view.compile if view.has_version else None
            if figures:
                compile_s.add_metric([name], float(figures.get("seconds", 0.0)))
            ws = getattr(host, "last_worker_status", None)
            if ws is not None:
                serving_compiles.add_metric([name], ws.serving_compiles)
            nv_pending.add_metric([name, v], view.queue_depth)
            nv_success.add_metric([name, v], c["ok"])
            nv_failure.add_metric([name, v, "REJECTED"], c["rejected"] + c["timed_out"])
            nv_failure.add_metric([name, v, "BACKEND"], c["failed"])
            nv_failure.add_metric([name, v, "OTHER"], bad)
            nv_queue.add_metric([name, v], self.metrics.queue_seconds.total_s(name) * 1e6)
        yield from (depth, limit, inflight, requests, retried, version, state, ready)
        yield from (load, warm, restarts, compile_s, serving_compiles)
        yield from _gpu_families(getattr(session, "gpu_snapshot", None))
        yield from (nv_pending, nv_success, nv_failure, nv_queue, nv_load)


def _gpu_families(snapshot: Any) -> Iterator[Metric]:
    """Per-GPU gauges from a `hotreload.gpu.readings.GpuSnapshot` (duck-typed: this layer
    never imports the GPU code); nothing when there is no snapshot or NVML is unavailable."""
    if snapshot is None or not getattr(snapshot, "available", False):
        return
    labels = ["gpu", "name", "uuid"]
    used = GaugeMetricFamily("hotreload_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
    total = GaugeMetricFamily("hotreload_gpu_memory_total_bytes", "GPU memory", labels=labels)
    util = GaugeMetricFamily(
        "hotreload_gpu_utilization_ratio", "GPU utilization, 0 to 1", labels=labels
    )
    for dev in snapshot.devices:
        key = [str(dev.index), dev.name, dev.uuid]
        if dev.problem:
            continue
        used.add_metric(key, dev.memory_used)
        total.add_metric(key, dev.memory_total)
        if dev.utilization_pct is not None:
            util.add_metric(key, dev.utilization_pct / 100)
    yield from (used, total, util)

"""Metrics fed by the event bus and the router's latency windows, without a server: what a
scrape shows."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.parser import text_string_to_metric_families

from hotreload.engine.events import EventBus
from hotreload.engine.stats import LatencyWindow
from hotreload.gpu.xid import event_to_json, parse_line
from hotreload.http.metrics import REQUEST_BUCKETS, LatencyHistogram, SessionMetrics


def samples(metrics: SessionMetrics, name: str) -> list[tuple[dict[str, str], float]]:
    text = metrics.exposition().decode()
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_xid_events_are_counted_per_gpu() -> None:
    bus = EventBus()
    metrics = SessionMetrics(SimpleNamespace(models={}, events=bus))  # type: ignore[arg-type]
    lost = parse_line("NVRM: Xid (PCI:0000:65:00): 79, pid=1, GPU has fallen off the bus.")
    assert lost is not None
    # As the engine's telemetry emits them: one on a GPU NVML knows, one it cannot place.
    bus.emit("xid", **event_to_json(replace(lost, device_index=1)))
    bus.emit("xid", **event_to_json(lost))
    got = samples(metrics, "hotreload_gpu_xid_events_total")
    assert sorted((labels["gpu"], labels["code"], value) for labels, value in got) == [
        ("", "79", 1.0),
        ("1", "79", 1.0),
    ]
    assert all(labels["severity"] == "hardware" for labels, _ in got)
    metrics.close()
    bus.emit("xid", **event_to_json(lost))  # closed: no longer counting
    assert sum(v for _, v in samples(metrics, "hotreload_gpu_xid_events_total")) == 2


@pytest.mark.parametrize("created", [True, False])
def test_latency_histograms_expose_what_a_prometheus_histogram_does(
    created: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted in plain numbers on the request path, exposed as prometheus_client's own
    `Histogram` exposes the same observations: every line alike, `_created` included (or
    left out, as `disable_created_metrics` asks)."""
    monkeypatch.setattr(prometheus_metrics, "_use_created", created)
    theirs_registry, ours_registry = CollectorRegistry(auto_describe=False), CollectorRegistry()
    name, doc = "hotreload_request_duration_seconds", "Time from admission to reply"
    theirs = Histogram(name, doc, ["model"], buckets=REQUEST_BUCKETS, registry=theirs_registry)
    ours = LatencyHistogram(name, doc, REQUEST_BUCKETS)
    ours_registry.register(ours)
    # On a bound, between bounds, past the last, zero; a model never observed shows zeros.
    samples_ms = [0.0, 0.4, 0.5, 0.50001, 1.0, 300.0, 29_999.0, 30_000.0, 31_000.0, 2.5]
    for model, values in (("a", samples_ms), ("b", samples_ms[:3]), ("c", [])):
        series, child = ours.labels(model), theirs.labels(model)
        series.created = child._created
        for ms in values:
            series.observe_ms(ms)
            child.observe(ms / 1000)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)


def test_queue_time_alias_is_the_queue_histograms_sum() -> None:
    host = SimpleNamespace(name="m", latency_windows=lambda: (LatencyWindow(), LatencyWindow()))
    windows: list[Any] = []
    host.set_latency_windows = lambda latency, queue: windows.extend([latency, queue])
    metrics = SessionMetrics(SimpleNamespace(models={}, events=EventBus()))  # type: ignore[arg-type]
    metrics._tee_router(host)  # type: ignore[arg-type]
    latency, queue = windows
    for ms in (1.5, 2.5):
        queue.add(ms)
    latency.add(7.0)
    assert metrics.queue_seconds.total_s("m") == pytest.approx(0.004)
    assert metrics.queue_seconds.total_s("never") == 0.0
    text = metrics.exposition().decode()
    assert 'hotreload_queue_duration_seconds_count{model="m"} 2.0' in text
    assert 'hotreload_request_duration_seconds_bucket{le="0.01",model="m"} 1.0' in text

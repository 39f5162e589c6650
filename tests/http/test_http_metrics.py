"""Metrics fed by the event bus, without a server: what a scrape shows for each event."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from hotreload.engine.events import EventBus
from hotreload.gpu.xid import event_to_json, parse_line
from hotreload.http.metrics import SessionMetrics


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

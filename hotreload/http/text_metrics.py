"""Prometheus series of text generators: tokens per second, time to first token, token
counts. Read at scrape time from each router's `text_stats` (engine/text_stats.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from hotreload.engine.session import Session


class TextCollector:
    """One registry collector for every generator of a session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def collect(self) -> Iterator[Metric]:
        m = ["model"]
        rate = GaugeMetricFamily(
            "hotreload_generation_tokens_per_second",
            "New tokens per second of worker compute, over the last minute's completions",
            labels=m,
        )
        ttft = GaugeMetricFamily(
            "hotreload_time_to_first_token_seconds",
            "Time to first new token inside the worker over the last minute (quantile 0.5/0.95)",
            labels=["model", "quantile"],
        )
        prompt = CounterMetricFamily(
            "hotreload_prompt_tokens", "Prompt tokens of completions", labels=m
        )
        made = CounterMetricFamily(
            "hotreload_completion_tokens", "New tokens of completions", labels=m
        )
        for host in self.session.models.values():
            if not host.model.generator:
                continue
            s = host.view.text
            rate.add_metric([host.name], s["tokens_per_s"])
            ttft.add_metric([host.name, "0.5"], s["ttft_p50_ms"] / 1000)
            ttft.add_metric([host.name, "0.95"], s["ttft_p95_ms"] / 1000)
            prompt.add_metric([host.name], s["prompt_tokens"])
            made.add_metric([host.name], s["completion_tokens"])
        yield from (rate, ttft, prompt, made)

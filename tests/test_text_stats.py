"""Tokens per second and time to first token, from the worker's replies to completions."""

from __future__ import annotations

from hotreload.engine.text_stats import TextStats
from hotreload.tui.render import latency_text


def test_tokens_per_second_over_compute_and_first_token_percentiles() -> None:
    s = TextStats(window_s=60)
    usage = {"prompt_tokens": 10, "completion_tokens": 20}
    s.add({"usage": usage, "compute_ms": 100.0, "first_token_s": 0.010}, now=1.0)
    s.add({"usage": usage, "compute_ms": 100.0, "first_token_s": 0.020}, now=1.5)
    s.add({"usage": usage, "compute_ms": 200.0, "first_token_s": 0.030}, now=2.0)
    s.add({"tokens": [1, 2]}, now=2.0)  # a /tokenize reply: no usage, not counted
    got = s.summary(now=3.0)
    assert got["tokens_per_s"] == 150.0  # 60 new tokens in 0.4 s of compute
    assert (got["ttft_p50_ms"], got["ttft_p95_ms"]) == (20.0, 30.0)
    assert (got["completions"], got["prompt_tokens"], got["completion_tokens"]) == (3, 30, 60)
    # The rate is of the last minute; the totals are since the start.
    later = s.summary(now=100.0)
    assert later["tokens_per_s"] == 0.0 and later["completion_tokens"] == 60


def test_the_dashboard_shows_them_under_the_latency() -> None:
    lat = {"count": 3, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}
    text = {"completions": 2, "tokens_per_s": 166.9, "ttft_p50_ms": 42.84}
    shown = latency_text({"latency": lat, "text": text}, [1.0, 2.0], 60).plain
    assert "167 tok/s  first token 42.8 ms" in shown
    assert "tok/s" not in latency_text({"latency": lat}, [1.0], 60).plain

"""Per-model counters and rolling latency percentiles."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


@dataclass
class LatencyWindow:
    """The last `max_samples` latencies no older than `window_s` seconds."""

    window_s: float = 60.0
    max_samples: int = 8192
    _samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, latency_ms: float, now: float | None = None) -> None:
        self._samples.append((now if now is not None else time.monotonic(), latency_ms))
        if len(self._samples) > self.max_samples:
            self._samples.popleft()

    def since(self, t: float) -> list[float]:
        """The latencies recorded at or after monotonic time `t` (newest last)."""
        out = []
        for at, v in reversed(self._samples):
            if at < t:
                break
            out.append(v)
        return out[::-1]

    def summary(self, now: float | None = None) -> dict[str, float | int]:
        cutoff = (now if now is not None else time.monotonic()) - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
        values = sorted(v for _, v in self._samples)
        return {
            "count": len(values),
            "p50_ms": round(percentile(values, 50), 3),
            "p95_ms": round(percentile(values, 95), 3),
            "p99_ms": round(percentile(values, 99), 3),
            "max_ms": round(values[-1], 3) if values else 0.0,
        }


@dataclass
class RequestCounters:
    ok: int = 0
    rejected: int = 0
    timed_out: int = 0
    #: model_error + unavailable.
    failed: int = 0
    #: The model raised while computing the request.
    model_error: int = 0
    #: No worker could serve it (died after its retry, unloaded, shutting down).
    unavailable: int = 0
    retried: int = 0
    bad_request: int = 0

    def fail(self, kind: str) -> None:
        self.failed += 1
        if kind == "model_error":
            self.model_error += 1
        else:
            self.unavailable += 1

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

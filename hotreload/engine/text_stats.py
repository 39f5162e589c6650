"""Figures of a text-generating model: tokens per second and time to first token.

The router records each `text` reply (engine/router.py); `/metrics` and the dashboard read
`summary()`. Tokens per second is over the worker's compute time for completions, so it says
how fast the model generates, not how busy clients kept it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hotreload.engine.stats import percentile


@dataclass
class TextStats:
    """Completions of the last `window_s` seconds, and totals since the session started."""

    window_s: float = 60.0
    max_samples: int = 4096
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completions: int = 0
    #: (monotonic time, completion tokens, compute seconds, first-token ms or None).
    _samples: deque[tuple[float, int, float, float | None]] = field(default_factory=deque)

    def add(self, reply: dict[str, Any], now: float | None = None) -> None:
        """Record one worker reply to a completions request (tokenizer replies carry no
        usage and are not counted)."""
        usage = reply.get("usage")
        if not isinstance(usage, dict):
            return
        made = int(usage.get("completion_tokens") or 0)
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += made
        self.completions += 1
        first = reply.get("first_token_s")
        first_ms = float(first) * 1000 if isinstance(first, (int, float)) else None
        compute_s = float(reply.get("compute_ms") or 0.0) / 1000
        self._samples.append(
            (now if now is not None else time.monotonic(), made, compute_s, first_ms)
        )
        if len(self._samples) > self.max_samples:
            self._samples.popleft()

    def summary(self, now: float | None = None) -> dict[str, Any]:
        cutoff = (now if now is not None else time.monotonic()) - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
        made = sum(s[1] for s in self._samples)
        busy = sum(s[2] for s in self._samples)
        firsts = sorted(s[3] for s in self._samples if s[3] is not None)
        return {
            "tokens_per_s": round(made / busy, 2) if busy > 0 else 0.0,
            "ttft_p50_ms": round(percentile(firsts, 50), 3),
            "ttft_p95_ms": round(percentile(firsts, 95), 3),
            "completions": self.completions,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }

"""One line for what torch.compile did in a warm phase (WarmReply.compile): the warm
phase's detail, the reload row, `hotreload check` and the dashboard say it alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def compile_text(figures: Mapping[str, Any] | None) -> str:
    """`compiled 12.30 s (2 compiles; cache 4 hit(s), 1 miss(es)); 3 CUDA graph
    recording(s); recompiled: <reason>`,
    or "" for a model torch.compile never ran in (eager)."""
    if not figures:
        return ""
    n = int(figures.get("compiles", 0))
    text = (
        f"compiled {float(figures.get('seconds', 0.0)):.2f} s ({n} compile{'s' * (n != 1)}; "
        f"cache {figures.get('hits', 0)} hit(s), {figures.get('misses', 0)} miss(es))"
    )
    recordings = int(figures.get("recordings", 0))
    if recordings:  # mode="reduce-overhead": recorded at a shape's second call, not compiled
        text += f"; {recordings} CUDA graph recording(s)"
    reasons = figures.get("reasons") or []
    if reasons:  # dynamo's guard failure: why a graph was compiled again
        text += f"; recompiled: {str(reasons[0]).splitlines()[0]}"
    return text

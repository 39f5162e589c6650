"""The dashboard's line for a compiled model: its warm phase's compile and the requests
that compiled on the serving path (issue 40)."""

from __future__ import annotations

from dataclasses import replace

from hotreload.tui.render import memory_text
from hotreload.tui.state import DashboardState
from tests.scripted_source import cpu_scenario

FIGURES = {"compiles": 3, "seconds": 13.21, "hits": 4, "misses": 1, "cache": {}, "reasons": []}


def test_the_memory_panel_says_what_compiling_cost_and_which_requests_compiled() -> None:
    samples, _ = cpu_scenario(steps=3)
    (m,) = samples[-1].models
    state = DashboardState()
    state.update(samples[-1])
    assert "compiled" not in memory_text(state, m["name"], 120).plain  # an eager model
    worker = {**(m.get("worker") or {}), "serving_compiles": 0}
    state.update(replace(samples[-1], models=({**m, "compile": FIGURES, "worker": worker},)))
    text = memory_text(state, m["name"], 120).plain
    assert "compiled 13.21 s (3 compiles; cache 4 hit(s), 1 miss(es)), 0 requests compiled" in text

"""The worker's eval thread runs on the build CPUs, like the loader thread
(worker/server.py): an eval's forwards over a held-out set are build work, never on the
CPUs the serving thread answers requests on."""

from __future__ import annotations

import queue
from typing import Any

import pytest

pytest.importorskip("torch")

from hotreload.worker.placement import BuildPlacement
from hotreload.worker.server import Worker


@pytest.mark.parametrize(("name", "placed"), [("eval", True), ("loader", True), ("control", False)])
def test_the_eval_thread_is_placed_on_the_build_cpus(name: str, placed: bool) -> None:
    worker = object.__new__(Worker)  # only the thread loop's choice is under test
    worker.build_cpus = [0]
    seen: list[Any] = []
    worker._run_queue = lambda q, placement=None: seen.append(placement)  # type: ignore[method-assign]
    worker._thread_loop(queue.SimpleQueue(), name)
    assert isinstance(seen[0], BuildPlacement) is placed
    if placed:
        assert seen[0].cpus == frozenset({0})

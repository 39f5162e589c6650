"""Pacing a build while the worker serves: the requests keep the CPU.

A reload builds the next version (import, factory, weights, warm-up passes, smoke test) on
the loader thread of the worker that is serving. On a machine whose cores are busy with
requests, that work takes its share of the CPU (and of the GIL) from every request that
overlaps it: measured on 2 cores at 32 clients, a 25 ms build made those requests ~35 %
slower. Pausing after each step, for `factor` times the step's own duration, lets the
serving thread run at full speed most of the reload, at the cost of a longer reload. The
pauses happen only while requests are flowing, so a reload on an idle model is as fast
as ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The longest single pause: a model whose steps take seconds is paced a little, not
#: slowed by minutes.
MAX_PAUSE_S = 0.05


class Pacer:
    def __init__(
        self,
        factor: float,
        busy: Callable[[], bool],
        max_pause_s: float = MAX_PAUSE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.factor = factor
        self.busy = busy
        self.max_pause_s = max_pause_s
        self.sleep = sleep
        #: Seconds spent pausing so far (reported with the phase).
        self.paused_s = 0.0
        self._mark = time.perf_counter()

    def step_done(self) -> None:
        """Call between the steps of a build: pauses when requests are being served."""
        now = time.perf_counter()
        worked = now - self._mark
        if self.factor > 0 and worked > 0 and self.busy():
            pause = min(worked * self.factor, self.max_pause_s)
            self.sleep(pause)
            self.paused_s += pause
        self._mark = time.perf_counter()


def no_pause() -> None:
    """The `step_done` of a build that is never paced (start-up, tests)."""

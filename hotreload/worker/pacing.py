"""Pacing a build while the worker serves: the requests keep the CPU.

A reload builds the next version on the loader thread of the worker that serves, and that
work takes its share of the CPU and the GIL from every request it overlaps (on 2 cores at 32
clients, a 25 ms build made those requests ~35 % slower). Pausing after each step, `factor`
times the step's own duration, lets serving run at full speed most of the reload, at the
cost of a longer reload; only when the serving thread was busy for most of the step, so a
reload of an idle model is as fast as ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The longest single pause: a model whose steps take seconds is paced a little, not
#: slowed by minutes.
MAX_PAUSE_S = 0.05
#: The serving thread busy for more than this share of a step means the requests are
#: competing with the build; a light poll (a developer's loop) does not slow a reload down.
BUSY_SHARE = 0.5


class Pacer:
    def __init__(
        self,
        factor: float,
        busy_seconds: Callable[[], float],
        max_pause_s: float = MAX_PAUSE_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`busy_seconds()`: the serving thread's total busy time so far (monotonic clock)."""
        self.factor = factor
        self.busy_seconds = busy_seconds
        self.max_pause_s = max_pause_s
        self.sleep = sleep
        self.clock = clock
        #: Seconds spent pausing so far (reported with the phase).
        self.paused_s = 0.0
        self._mark = clock()
        self._busy_mark = busy_seconds()

    def step_done(self) -> None:
        """Call between the steps of a build: pauses when serving was busy during the step."""
        now, busy = self.clock(), self.busy_seconds()
        worked = now - self._mark
        share = (busy - self._busy_mark) / worked if worked > 0 else 0.0
        if self.factor > 0 and share > BUSY_SHARE:
            pause = min(worked * self.factor, self.max_pause_s)
            self.sleep(pause)
            self.paused_s += pause
        self._mark, self._busy_mark = self.clock(), self.busy_seconds()


def no_pause() -> None:
    """The `step_done` of a build that is never paced (start-up, tests)."""

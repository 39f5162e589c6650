"""Build pacing: pauses in proportion to the step just done, only when serving was busy."""

from __future__ import annotations

import pytest

from hotreload.worker.pacing import Pacer


class Clocks:
    """A wall clock and the serving thread's busy-seconds counter, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.busy = 0.0
        self.pauses: list[float] = []

    def work(self, seconds: float, busy_share: float) -> None:
        self.now += seconds
        self.busy += seconds * busy_share

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def pacer(c: Clocks, factor: float = 3.0) -> Pacer:
    return Pacer(factor, lambda: c.busy, max_pause_s=0.05, sleep=c.sleep, clock=lambda: c.now)


def test_pauses_follow_the_step_while_serving_is_busy_and_are_capped() -> None:
    c = Clocks()
    p = pacer(c)
    c.work(0.010, busy_share=0.9)
    p.step_done()
    assert c.pauses == [pytest.approx(0.030)]  # 3x the 10 ms step
    c.work(0.030, busy_share=1.0)
    p.step_done()
    assert c.pauses[-1] == 0.05  # 90 ms wanted, capped
    assert p.paused_s == pytest.approx(0.08)


def test_a_lightly_used_or_idle_model_builds_at_full_speed() -> None:
    c = Clocks()
    p = pacer(c)
    c.work(0.010, busy_share=0.3)  # a developer polling now and then
    p.step_done()
    c.work(0.010, busy_share=0.0)
    p.step_done()
    assert c.pauses == [] and p.paused_s == 0.0


def test_factor_zero_never_pauses() -> None:
    c = Clocks()
    p = pacer(c, factor=0.0)
    c.work(0.010, busy_share=1.0)
    p.step_done()
    assert c.pauses == []

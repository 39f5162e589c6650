"""Build pacing: pauses proportional to the work just done, only while serving is busy."""

from __future__ import annotations

import time

from hotreload.worker.pacing import Pacer


def test_pauses_follow_the_work_while_busy_and_are_capped() -> None:
    pauses: list[float] = []
    busy = [True]
    pacer = Pacer(3.0, lambda: busy[0], max_pause_s=0.05, sleep=pauses.append)
    time.sleep(0.01)  # a 10 ms step
    pacer.step_done()
    assert 0.03 <= pauses[0] <= 0.05  # 3x the step, within the cap
    time.sleep(0.03)  # a 30 ms step: 90 ms wanted, capped at 50
    pacer.step_done()
    assert pauses[1] == 0.05
    busy[0] = False
    time.sleep(0.01)
    pacer.step_done()  # nothing is being served: no pause
    assert len(pauses) == 2
    assert pacer.paused_s == sum(pauses)


def test_factor_zero_never_pauses() -> None:
    pauses: list[float] = []
    pacer = Pacer(0.0, lambda: True, sleep=pauses.append)
    time.sleep(0.005)
    pacer.step_done()
    assert pauses == [] and pacer.paused_s == 0.0

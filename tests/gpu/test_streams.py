"""Stream sync: polling with a deadline (pure Python), and cuda-python without a driver."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from hotreload.worker.streams import StreamQueryError, StreamRef, raw_stream_ref, wait_streams_idle


def test_importing_stream_polling_loads_neither_cuda_python_nor_torch() -> None:
    # The worker imports it before it knows whether the model is on a GPU at all.
    code = (
        "import sys, hotreload.worker.streams\n"
        "bad = [m for m in ('cuda', 'torch', 'pynvml') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def busy_until(clock: FakeClock, t: float) -> StreamRef:
    return StreamRef(f"busy-until-{t}", lambda: clock.now >= t)


def test_idle_streams_return_at_once() -> None:
    out = wait_streams_idle([StreamRef("a", lambda: True), StreamRef("b", lambda: True)], 1.0)
    assert out.idle and out.busy == () and out.polls == 1


def test_streams_that_drain_before_the_deadline() -> None:
    clock = FakeClock()
    out = wait_streams_idle(
        [busy_until(clock, 0.01), busy_until(clock, 0.02)],
        deadline_s=1.0,
        poll_interval_s=0.001,
        clock=clock,
        sleep=clock.sleep,
    )
    assert out.idle and 0.02 <= out.waited_s < 0.03


def test_a_stream_busy_past_the_deadline_is_named() -> None:
    clock = FakeClock()
    stuck = StreamRef("old-model:stream-3", lambda: False)
    out = wait_streams_idle(
        [busy_until(clock, 0.001), stuck], 0.05, 0.001, clock=clock, sleep=clock.sleep
    )
    assert not out.idle and out.busy == ("old-model:stream-3",)
    assert out.waited_s >= 0.05 and out.polls > 10


def test_an_idle_stream_is_not_queried_again() -> None:
    calls = {"a": 0}

    def a() -> bool:
        calls["a"] += 1
        return True

    clock = FakeClock()
    wait_streams_idle(
        [StreamRef("a", a), busy_until(clock, 0.01)], 1.0, clock=clock, sleep=clock.sleep
    )
    assert calls["a"] == 1


def test_real_clock_deadline_is_respected() -> None:
    # Only the lower bound is a promise: a loaded machine may return late, never early.
    out = wait_streams_idle([StreamRef("s", lambda: False)], deadline_s=0.02)
    assert not out.idle and out.busy == ("s",) and out.waited_s >= 0.02


def test_query_errors_propagate() -> None:
    def broken() -> bool:
        raise StreamQueryError("cudaErrorIllegalAddress")

    with pytest.raises(StreamQueryError):
        wait_streams_idle([StreamRef("s", broken)], 1.0)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a driver may be present")
def test_raw_stream_without_a_driver_raises_a_clear_error() -> None:
    ref = raw_stream_ref("legacy-default", 0)
    with pytest.raises(StreamQueryError, match="cudaStreamQuery on stream 'legacy-default'"):
        ref.query()

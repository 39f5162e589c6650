"""Issue 38: who is told what when a worker is killed, or a start fails.

- Item 4: when a forward is killed past its deadline, the request that hung is the one told
  (a 504 saying so); the requests behind it are retried on the restarted worker and never
  told they "may be what killed the worker". Before, once the hung request's own timeout
  had answered it, the next request in line took the blame.
- Item 14: when a start fails, every request waiting for the model gets the start error at
  once, the same one a request sent after gets, instead of waiting out its timeout.

The supervisor is stepped in-process over scripted fake workers (tests/supervisor/).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from hotreload.config.models import Deadlines
from hotreload.engine.model import PhaseFailed
from hotreload.engine.router import ModelRouter
from hotreload.engine.worker_port import WorkerDied
from hotreload.errors import RequestTimeoutError, WorkerUnavailableError
from hotreload.protocol.framing import Frame
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.tensors import encode_tensors
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, kinds, request, stepped

DEAD = "worker process was killed by SIGKILL"


def _request(sup: Any, timeout_s: float | None = None) -> asyncio.Future:
    metas, blobs = encode_tensors({"x": np.zeros((1, 4), np.float32)})
    header: dict[str, Any] = {"tensors": metas}
    if timeout_s is not None:
        header["timeout_s"] = timeout_s
    return sup.router.submit_future(header, b"".join(bytes(b) for b in blobs))


async def _replaced(sup: Any, old: Any) -> None:
    for _ in range(500):
        if sup.worker is not old and sup.state == "serving":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the hung worker was not replaced: {sup.state}")


@stepped
async def test_a_forward_killed_past_its_deadline_is_the_one_told(make: Make) -> None:
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.3, drain_s=0.1))
    await sup.start()
    hung = sup.worker
    assert hung is not None
    script.hung.add(hung.pid)
    stuck = _request(sup)
    await asyncio.sleep(0.05)
    behind = _request(sup)  # sent to the hung worker too, queued behind the hung forward
    await _replaced(sup, hung)
    with pytest.raises(RequestTimeoutError, match="killed past its deadline") as told:
        await asyncio.wait_for(stuck, 10)
    assert "deadlines.forward_s = 0.3 s" in str(told.value)
    # Innocent: retried on the restarted worker, which answers it.
    assert (await asyncio.wait_for(behind, 10)).header["version"] == 1
    assert kinds(sup, "wedged", "worker_restarted") == ["wedged", "worker_restarted"]


@stepped
async def test_the_request_behind_a_hung_one_that_timed_out_is_not_blamed(make: Make) -> None:
    """The issue's case: the hung request's client gave up first (its own 504); the one
    sent just after it was then told it "may be what killed the worker"."""
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.4, drain_s=0.1))
    await sup.start()
    hung = sup.worker
    assert hung is not None
    script.hung.add(hung.pid)
    stuck = _request(sup, timeout_s=0.1)
    await asyncio.sleep(0.02)
    behind = _request(sup)
    with pytest.raises(RequestTimeoutError, match=r"timed out after 0\.1 s"):
        await asyncio.wait_for(stuck, 10)
    await _replaced(sup, hung)
    assert (await asyncio.wait_for(behind, 10)).header["version"] == 1


def test_a_crash_is_put_down_to_the_oldest_request_even_once_it_timed_out() -> None:
    """A crash, not a hang: the same rule. The oldest the worker held was computing when it
    died, whether or not its client still waits; the ones behind it are retried."""

    class Worker:
        alive, exit_reason = True, None

        def __init__(self) -> None:
            self.sent: list[Any] = []

        def submit(self, header: dict[str, Any], blobs: Any, waiter: Any) -> bool:
            self.sent.append(waiter)
            return True

    async def run() -> None:
        r = ModelRouter(name="m", max_queue_size=8, request_timeout_s=30, max_inflight=4)
        old, new = Worker(), Worker()
        r.worker = old  # type: ignore[assignment]
        r.open_gate()
        first = r.submit_future({"tensors": [], "timeout_s": 0.05}, b"")
        second = r.submit_future({"tensors": [], "form": "single"}, b"")
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(first, 5)
        r.close_gate()  # the supervisor restarts the worker behind a closed gate
        for waiter in old.sent:
            waiter(None, WorkerDied(DEAD))
        assert not second.done(), "the innocent one waits for the restarted worker"
        r.worker = new  # type: ignore[assignment]
        r.open_gate()
        assert len(new.sent) == 1
        new.sent[0](Frame({"ok": True, "version": 1}, b""), None)
        assert (await asyncio.wait_for(second, 5)).header["version"] == 1

    asyncio.run(asyncio.wait_for(run(), 30))


@stepped
async def test_requests_sent_while_a_start_fails_get_its_error_at_once(make: Make) -> None:
    script = Script()
    sup = make(script, request_timeout_s=30.0)
    script.hold(WorkerOp.LOAD)
    script.fail_next[WorkerOp.LOAD] = {"message": "no module named 'modle'", "type": "LoadError"}
    starting = asyncio.ensure_future(sup.start())
    await script.started(WorkerOp.LOAD)
    waiting = [request(sup) for _ in range(3)]
    assert sup.router.depth == 3
    script.release(WorkerOp.LOAD)
    with pytest.raises(PhaseFailed):
        await starting
    errors = []
    for fut in waiting:
        with pytest.raises(WorkerUnavailableError) as got:
            await asyncio.wait_for(fut, 5)  # not the 30 s timeout
        errors.append(str(got.value))
    with pytest.raises(WorkerUnavailableError) as later:
        await request(sup)
    assert errors == [str(later.value)] * 3
    assert "failed to start" in errors[0] and "no module named 'modle'" in errors[0]
    assert sup.router.depth == 0

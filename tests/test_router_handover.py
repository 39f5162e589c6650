"""The router's hand-over: the new worker gets requests once the old one has finished its
own (or after HANDOVER_HOLD_S), so two serving processes never share the serving CPUs.

The worker is a recorder at the router's one seam (`alive`, `submit`): these
tests decide when each reply comes, which a real worker process cannot be told to do to the
millisecond. The same hand-over runs end to end in test_reload.py and test_cpus.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from hotreload.engine.router import HANDOVER_HOLD_S, ModelRouter
from hotreload.engine.worker_port import WorkerDied
from hotreload.protocol.framing import Frame


class RecordingWorker:
    alive = True
    exit_reason = None

    def __init__(self) -> None:
        self.sent: list[Callable[[Frame | None, BaseException | None], None]] = []

    def submit(self, header: dict[str, Any], blobs: list[Any], on_reply: Any) -> bool:
        self.sent.append(on_reply)
        return True

    def reply(self, i: int) -> None:
        self.sent[i](Frame({"ok": True, "version": 1}, b""), None)


def router() -> ModelRouter:
    r = ModelRouter(name="m", max_queue_size=64, request_timeout_s=30, max_inflight=4)
    r.input_form = "single"
    return r


def serving_old() -> tuple[ModelRouter, RecordingWorker, RecordingWorker]:
    """A router serving on `old`, and the `new` worker to hand over to."""
    r, old, new = router(), RecordingWorker(), RecordingWorker()
    r.worker = old  # type: ignore[assignment]
    r.open_gate()
    return r, old, new


def submit(r: ModelRouter, done: list[Frame | None]) -> None:
    r.submit({"tensors": [], "form": "single"}, b"", lambda f, e: done.append(f))


def test_the_new_worker_starts_when_the_old_one_is_empty() -> None:
    async def run() -> None:
        r, old, new = serving_old()
        done: list[Frame | None] = []
        for _ in range(2):
            submit(r, done)
        assert len(old.sent) == 2
        r.handover(new)  # type: ignore[arg-type]
        for _ in range(3):
            submit(r, done)
        assert new.sent == [] and r.depth == 3, "held while the old worker has requests"
        old.reply(0)
        assert new.sent == [], "one still on the old worker"
        old.reply(1)
        assert len(new.sent) == 3 and r.depth == 0 and len(done) == 2
        assert await r.drain_previous(1.0)

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_hung_old_worker_holds_the_new_one_only_briefly() -> None:
    async def run() -> None:
        r, _old, new = serving_old()
        submit(r, [])
        r.handover(new)  # type: ignore[arg-type]
        t0 = time.monotonic()
        submit(r, [])
        assert new.sent == []
        while not new.sent:  # the hold's timer dispatches; generous bound for a busy CI
            assert time.monotonic() - t0 < 10, "never dispatched to the new worker"
            await asyncio.sleep(0.01)
        assert time.monotonic() - t0 >= HANDOVER_HOLD_S * 0.9
        assert r.draining == 1 and not await r.drain_previous(0.05)

    asyncio.run(asyncio.wait_for(run(), 30))


def test_an_idle_old_worker_hands_over_at_once() -> None:
    async def run() -> None:
        r, old, new = serving_old()
        r.handover(new)  # type: ignore[arg-type]
        submit(r, [])
        assert len(new.sent) == 1 and old.sent == []

    asyncio.run(asyncio.wait_for(run(), 30))


def test_an_old_worker_that_dies_in_the_hold_has_its_requests_retried_on_the_new() -> None:
    async def run() -> None:
        r, old, new = serving_old()
        done: list[Frame | None] = []
        submit(r, done)
        submit(r, done)
        r.handover(new)  # type: ignore[arg-type]
        submit(r, done)
        assert new.sent == []
        old.sent[0](None, WorkerDied("killed"))
        old.sent[1](None, WorkerDied("killed"))
        # The one it was computing may be what killed it: not sent again (issue 30).
        assert len(new.sent) == 2, "the retried request and the queued one"
        assert r.draining == 0 and await r.drain_previous(1.0)
        new.reply(0)
        new.reply(1)
        assert len(done) == 3 and done[0] is None and all(f is not None for f in done[1:])
        assert r.counters.retried == 1

    asyncio.run(asyncio.wait_for(run(), 30))

"""Streamed text requests across reloads, on the fake worker through the port (seconds).

A stream is in flight from its send to its final frame: a reload's drain waits for it, it
ends on the version that started it, and past the drain deadline (`drain_s`) the reload
ends it with an error naming the reload and goes on. A client gone stops it in the worker
(a CANCEL); its timeout bounds its first token, not its length; a worker dying under it
ends it (never sent again after a token: it would start over, or on another version).
tests/test_worker_ops.py proves the same frames and CANCEL on the real worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hotreload.config.models import Deadlines
from hotreload.engine.model import ModelSupervisor, phases
from hotreload.engine.router import ModelRouter
from hotreload.engine.text_stream import TextStream
from hotreload.errors import (
    ClientError,
    ModelError,
    RequestTimeoutError,
    WorkerUnavailableError,
)
from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import PARTIAL
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.supervisor.test_supervisor_steps import Make, stepped

TEXT = {"task": "complete", "prompts": ["x"], "sampling": {"max_tokens": 1000}}


def stream(sup: ModelSupervisor, max_tokens: int = 5) -> TextStream:
    text = {
        "task": "complete",
        "prompts": ["x"],
        "sampling": {"max_tokens": max_tokens, "temperature": 0.0},
        "stream": True,
    }
    return sup.router.stream({"op": WorkerOp.TEXT, "text": text})


async def first(s: TextStream) -> list[Frame]:
    return await asyncio.wait_for(s.next(), 10)


async def rest(s: TextStream) -> tuple[list[Frame], ClientError | None]:
    """Every frame to the stream's end, and the error it ended with (None: its reply)."""
    frames: list[Frame] = []
    try:
        while batch := await asyncio.wait_for(s.next(), 10):
            frames += batch
    except ClientError as exc:
        return frames, exc
    return frames, None


def versions(frames: list[Frame]) -> set[int]:
    return {f.header["version"] for f in frames}


def text_of(frames: list[Frame]) -> str:
    return "".join(f.header["choices"][0]["text"] for f in frames if f.header.get(PARTIAL))


@stepped
async def test_a_reload_drains_a_stream_which_ends_on_its_own_version(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.hold_streams()
    s = stream(sup)
    started = await first(s)
    reload = asyncio.create_task(sup.reload("file"))
    await asyncio.sleep(0.3)  # every fake op answers at once: only the stream holds it
    assert not reload.done() and sup.router.inflight == 1
    script.release_streams()
    frames, error = await rest(s)
    outcome = await asyncio.wait_for(reload, 10)
    assert error is None and outcome.ok and outcome.version == 2
    assert versions(started + frames) == {1}
    assert text_of(started + frames) == frames[-1].header["choices"][0]["text"]
    assert frames[-1].header["choices"][0]["finish_reason"] == "length"
    # The next stream is the new version's, all of it.
    assert versions((await rest(stream(sup)))[0]) == {2}


@pytest.mark.parametrize(
    "changes",
    [{}, {"strategy": "respawn"}, {"policy": "resource"}],
    ids=["in-band", "hand-over", "resource"],
)
def test_a_stream_past_the_drain_deadline_ends_naming_the_reload(
    tmp_path: Path, changes: dict[str, str]
) -> None:
    """In each way a reload drains (the serving worker's in-band swap, a hand-over to a new
    worker, the resource policy's closed gate), a stream still running at drain_s ends
    with an error naming the reload, and the reload goes on: the drain deadline for a
    forward (forward_s, 60 s here) is not waited for."""

    @stepped
    async def body(make: Make) -> None:
        script = Script()
        sup = make(script, deadlines=Deadlines(drain_s=0.2), **changes)
        await sup.start()
        old = sup.worker
        assert isinstance(old, FakeWorker)
        script.hold_streams()
        s = stream(sup, max_tokens=1000)
        started = await first(s)
        outcome = await asyncio.wait_for(sup.reload("file"), 10)
        frames, error = await rest(s)
        assert outcome.ok and outcome.version == 2, outcome
        assert isinstance(error, WorkerUnavailableError)
        assert "stream ended: model reloading to v2" in str(error) and "drain" in str(error)
        assert versions(started + frames) == {1}
        assert old.cancelled == 1 and ("cancel" in script.ops(old.pid))
        assert sup.router.inflight == 0 and sup.version == 2

    body(tmp_path)


@stepped
async def test_streams_across_a_hand_over_each_keep_their_worker(make: Make) -> None:
    """respawn: the old worker finishes the stream it started while the new worker streams
    the next one; neither mixes versions."""
    script = Script()
    sup = make(script, strategy="respawn")
    await sup.start()
    script.hold_streams()
    a = stream(sup)
    a_first = await first(a)
    reload = asyncio.create_task(sup.reload("file"))
    for _ in range(500):
        if sup.router.version == 2:
            break
        await asyncio.sleep(0.01)
    b = stream(sup)
    b_first = await first(b)
    assert not reload.done()  # the drain waits for stream a on the old worker
    script.release_streams()
    (a_rest, a_error), (b_rest, b_error) = await asyncio.gather(rest(a), rest(b))
    assert (await asyncio.wait_for(reload, 10)).ok
    assert a_error is None and b_error is None
    assert versions(a_first + a_rest) == {1} and versions(b_first + b_rest) == {2}


@stepped
async def test_a_client_gone_stops_its_stream_in_the_worker(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    worker = sup.worker
    assert isinstance(worker, FakeWorker)
    script.stream_step_s = 0.01
    s = stream(sup, max_tokens=1000)
    await first(s)
    s.close()
    for _ in range(500):
        if sup.router.inflight == 0:
            break
        await asyncio.sleep(0.01)
    assert sup.router.inflight == 0 and worker.cancelled == 1
    assert script.ops(worker.pid).count("cancel") == 1
    counts = sup.router.counters
    assert (counts.failed, counts.ok) == (0, 0)  # a client gone is nobody's failure
    assert (await rest(s)) == ([], None)


@stepped
async def test_a_queued_stream_whose_client_goes_is_never_sent(make: Make) -> None:
    script = Script()
    sup = make(script, max_inflight=1)
    await sup.start()
    script.hold_streams()
    a = stream(sup)
    await first(a)
    b = stream(sup)
    assert sup.router.depth == 1
    b.close()
    assert sup.router.depth == 0
    script.release_streams()
    assert (await rest(a))[1] is None
    assert script.ops().count(WorkerOp.TEXT) == 1


@stepped
async def test_a_streams_timeout_bounds_its_first_token_not_its_length(make: Make) -> None:
    script = Script()
    sup = make(script, request_timeout_s=0.3)
    await sup.start()
    script.stream_step_s = 0.05  # 20 tokens: a second, past the timeout
    frames, error = await rest(stream(sup, max_tokens=20))
    assert error is None and len(frames) == 21
    # A first token that never comes (a hung forward) times out.
    assert sup.worker is not None
    script.hung.add(sup.worker.pid)
    frames, error = await rest(stream(sup))
    assert frames == [] and isinstance(error, RequestTimeoutError)


@stepped
async def test_a_streaming_forward_is_not_a_hung_one(make: Make) -> None:
    """forward_s bounds the time between a stream's tokens: one longer than forward_s that
    keeps making tokens is not killed by the watchdog."""
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.3, drain_s=0.1))
    await sup.start()
    worker = sup.worker
    script.stream_step_s = 0.05
    frames, error = await rest(stream(sup, max_tokens=20))  # about a second
    assert error is None and len(frames) == 21
    assert sup.worker is worker and sup.record.restarts == 0


@stepped
async def test_requests_waiting_behind_a_long_stream_are_not_hung_ones(make: Make) -> None:
    """The worker's serving thread decodes one request at a time: a second stream and a
    text request sent behind a stream longer than forward_s wait for it without progress
    of their own. The worker's tokens are its progress: no restart, all three answered."""
    script = Script()
    sup = make(script, deadlines=Deadlines(forward_s=0.3, drain_s=0.1))
    await sup.start()
    worker = sup.worker
    script.stream_step_s = 0.05
    a, b = stream(sup, max_tokens=20), stream(sup, max_tokens=20)  # about a second each
    text = {"task": "complete", "prompts": ["x"], "sampling": {"max_tokens": 2}}
    plain = sup.router.submit_future({"op": WorkerOp.TEXT, "text": text}, b"")
    (fa, ea), (fb, eb) = await asyncio.gather(rest(a), rest(b))
    assert ea is None and eb is None, (ea, eb)
    assert len(fa) == len(fb) == 21
    assert (await asyncio.wait_for(plain, 10)).header["ok"]
    assert sup.worker is worker and sup.record.restarts == 0


def test_a_stream_pumped_as_the_in_band_swap_starts_is_ended_at_drain_s() -> None:
    """A reply landing in the loop turn the in-band drain starts in pumps a queued stream
    to the worker before the swap's frame goes out: that stream is ahead of the swap, and
    it is ended at drain_s like the others (it was not: the swap waited for it to the
    drain deadline and the reload wedged, the worker killed)."""
    asyncio.run(asyncio.wait_for(_stream_pumped_as_the_swap_starts(), 10))


async def _stream_pumped_as_the_swap_starts() -> None:
    script = Script()
    worker = FakeWorker(script, 1)
    await worker.start(1)
    worker.version, worker.staged = 1, 2
    router = ModelRouter("m", 100, 30.0, max_inflight=1, worker=worker)
    router.open_gate()
    script.hold_streams()
    d = Deadlines(drain_s=0.2, forward_s=1.0, sync_s=0.5)
    ended: list[ClientError | None] = []

    async def run(name: str, fn: Callable[[], Awaitable[Any]], **_: Any) -> Any:
        if name == "drain":
            # A forward the fake answers in the next loop turn, and a stream behind it.
            router.submit({"op": WorkerOp.INFER, "tensors": []}, b"", lambda f, e: None)
            s = router.stream({"op": WorkerOp.TEXT, "text": {**TEXT, "stream": True}})
            assert router.depth == 1
            ended.append(None)
            result = await fn()
            ended[0] = (await rest(s))[1]
            return result
        return await fn()

    try:
        await asyncio.wait_for(phases.in_band(run, worker, d, router, lambda: None, version=2), 5)
        assert worker.version == 2 and worker.cancelled == 1
        assert isinstance(ended[0], WorkerUnavailableError)
        assert "reloading to v2" in str(ended[0])
    finally:
        script.release_streams()
        await worker.end()


@stepped
async def test_a_streams_latency_is_its_time_to_first_token(make: Make) -> None:
    """The latency window (/metrics, the dashboard's p99) holds a stream's time to first
    token, not its whole length (its client's max_tokens, not the model's speed)."""
    script = Script()
    sup = make(script)
    await sup.start()
    script.stream_step_s = 0.05
    frames, error = await rest(stream(sup, max_tokens=20))  # about a second
    assert error is None and len(frames) == 21
    summary = sup.router.latency.summary()
    assert summary["count"] == 1 and summary["p99_ms"] < 500, summary


@stepped
async def test_a_stream_waiting_with_tokens_sent_ends_when_its_worker_dies(make: Make) -> None:
    """A worker dying while computing one stream takes with it another that had sent
    tokens already: not the culprit (the oldest it held), yet never sent again, since it
    would start over after what its client read; it ends with an error saying so. (The
    serving thread decodes in send order, so this is the router's guard for a worker that
    did not: the second stream's token is counted by hand.)"""
    script = Script()
    sup = make(script, max_inflight=4)
    await sup.start()
    old = sup.worker
    assert isinstance(old, FakeWorker)
    script.hold_streams()
    a, b = stream(sup), stream(sup)
    await first(a)
    (req_b,) = [r for r in sup.router._inflight if r.on_part == b.part]
    req_b.parts = 1
    old.die("killed by signal 11")
    (_, error_a), (_, error_b) = await asyncio.gather(rest(a), rest(b))
    assert isinstance(error_a, WorkerUnavailableError) and "not sent again" in str(error_a)
    assert isinstance(error_b, WorkerUnavailableError)
    assert "stream ended: its worker failed after 1 chunk(s)" in str(error_b)
    assert script.ops(old.pid).count(WorkerOp.TEXT) == 2
    for _ in range(500):
        if sup.worker is not old and sup.state == "serving":
            break
        await asyncio.sleep(0.01)
    assert sup.worker is not old and WorkerOp.TEXT not in script.ops(sup.worker.pid)


@pytest.mark.parametrize("end", ["unload", "stop"])
def test_an_unload_or_shutdown_ends_a_stream_at_drain_s_naming_it(tmp_path: Path, end: str) -> None:
    """Unload and shutdown end a stream still running at drain_s with an error naming
    them, as a reload does: not held to drain_wait_s (forward_s, 60 s here), nor told
    that its worker failed when the worker is stopped under it."""

    @stepped
    async def body(make: Make) -> None:
        script = Script()
        sup = make(script, deadlines=Deadlines(drain_s=0.2))
        await sup.start()
        old = sup.worker
        assert isinstance(old, FakeWorker)
        script.hold_streams()
        s = stream(sup, max_tokens=1000)
        await first(s)
        ending = sup.unload() if end == "unload" else sup.stop(0.2)
        await asyncio.wait_for(ending, 10)
        _, error = await rest(s)
        assert isinstance(error, WorkerUnavailableError)
        what = "model unloading" if end == "unload" else "server shutting down"
        assert f"stream ended: {what}" in str(error) and "drain_s" in str(error), error
        assert old.cancelled == 1 and "cancel" in script.ops(old.pid)

    body(tmp_path)


@stepped
async def test_a_worker_dying_mid_stream_ends_it_without_a_retry(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    old = sup.worker
    assert isinstance(old, FakeWorker)
    script.hold_streams()
    s = stream(sup)
    await first(s)
    old.die("killed by signal 11")
    frames, error = await rest(s)
    assert frames == [] and isinstance(error, WorkerUnavailableError)
    assert "not sent again" in str(error)
    for _ in range(500):
        if sup.worker is not old and sup.state == "serving":
            break
        await asyncio.sleep(0.01)
    new = sup.worker
    assert new is not old and new is not None
    assert WorkerOp.TEXT not in script.ops(new.pid)  # not sent again


@stepped
async def test_a_frame_of_another_version_ends_the_stream(make: Make) -> None:
    """The router's guard: a stream whose worker sent two versions (no worker does: its
    serving thread decodes a stream whole) ends rather than hand a client a mix."""
    script = Script()
    sup = make(script)
    await sup.start()
    worker = sup.worker
    assert isinstance(worker, FakeWorker)
    script.hold_streams()
    s = stream(sup)
    started = await first(s)
    (rid,) = worker.streams
    part = started[0].header
    worker.streams[rid].waiter(Frame({**part, "version": 2}, b""), None)
    frames, error = await rest(s)
    assert frames == [] and isinstance(error, ModelError)
    assert "v1 wrote its start and v2 sent more" in str(error)
    script.release_streams()


def plain_text(sup: ModelSupervisor, max_tokens: int | None) -> tuple[Any, Any]:
    """A text request not streamed (a chat client's, `max_tokens` None: the rest of the
    context): its future and its stop."""
    text = {
        "task": "chat",
        "messages": [{"role": "user", "content": "x"}],
        "sampling": {"max_tokens": max_tokens, "temperature": 0.0},
    }
    return sup.router.submit_stoppable({"op": WorkerOp.TEXT, "text": text})


async def until_idle(sup: ModelSupervisor) -> None:
    for _ in range(500):
        if sup.router.inflight == 0:
            return
        await asyncio.sleep(0.01)


@stepped
async def test_a_text_request_past_its_timeout_is_stopped_in_the_worker(make: Make) -> None:
    """A chat without max_tokens decodes to the end of the context: past its timeout the
    router sends it the CANCEL a stream's hang-up sends, so the serving thread (and a
    reload's drain behind it) does not decode on for nobody."""
    script = Script()
    sup = make(script, request_timeout_s=0.3)
    await sup.start()
    worker = sup.worker
    assert isinstance(worker, FakeWorker)
    script.hold_streams()  # the decode runs on until stopped
    fut, _ = plain_text(sup, None)
    with pytest.raises(RequestTimeoutError, match="inside the worker"):
        await asyncio.wait_for(fut, 10)
    await until_idle(sup)
    assert sup.router.inflight == 0 and worker.cancelled == 1
    assert script.ops(worker.pid).count("cancel") == 1
    counts = sup.router.counters
    assert (counts.timed_out, counts.failed, counts.ok) == (1, 0, 0)
    # The serving line is free: the next request is answered, not held behind it.
    script.release_streams()
    fut, _ = plain_text(sup, 3)
    reply = await asyncio.wait_for(fut, 10)
    assert reply.header["ok"] and reply.header["choices"][0]["text"] == "t0 t1 t2 "


@stepped
async def test_a_text_request_whose_client_goes_is_stopped_in_the_worker(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    worker = sup.worker
    assert isinstance(worker, FakeWorker)
    script.hold_streams()
    fut, stop = plain_text(sup, 1000)
    for _ in range(500):
        if worker.streams:
            break
        await asyncio.sleep(0.01)
    stop()
    with pytest.raises(ClientError, match="the client went away"):
        await asyncio.wait_for(fut, 10)
    await until_idle(sup)
    assert sup.router.inflight == 0 and worker.cancelled == 1
    counts = sup.router.counters
    assert (counts.timed_out, counts.failed, counts.ok) == (0, 0, 0)  # nobody's failure

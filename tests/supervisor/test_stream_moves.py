"""A stream that has sent its client nothing when a reload's drain deadline passes (it
waited in the worker behind a long one) is not ended with the old version: it is stopped
there and goes to the new version, whole. Only a stream already under way ends naming the
reload (tests/supervisor/test_streams.py). On the fake worker through the port."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hotreload.config.models import Deadlines
from hotreload.engine.model import ModelSupervisor
from hotreload.engine.text_stream import TextStream
from hotreload.errors import WorkerUnavailableError
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.supervisor.test_streams import first, rest, stream, text_of, versions
from tests.supervisor.test_supervisor_steps import Make, stepped


async def behind_a_held_stream(
    make: Make, **changes: str
) -> tuple[Script, ModelSupervisor, TextStream, TextStream]:
    """A session (drain_s 0.2 s) whose worker holds a stream after its first token, and a
    second stream sent behind it: in the worker, nothing sent yet."""
    script = Script()
    sup = make(script, deadlines=Deadlines(drain_s=0.2), **changes)
    await sup.start()
    script.hold_streams()
    running = stream(sup, max_tokens=1000)
    await first(running)
    waiting = stream(sup, max_tokens=5)
    assert sup.router.inflight == 2
    return script, sup, running, waiting


@pytest.mark.parametrize(
    "changes",
    [{}, {"strategy": "respawn"}, {"policy": "resource"}],
    ids=["in-band", "hand-over", "resource"],
)
def test_a_stream_not_started_at_the_drain_deadline_moves_to_the_new_version(
    tmp_path: Path, changes: dict[str, str]
) -> None:
    @stepped
    async def body(make: Make) -> None:
        script, sup, running, waiting = await behind_a_held_stream(make, **changes)
        old = sup.worker
        assert isinstance(old, FakeWorker)
        outcome = await asyncio.wait_for(sup.reload("file"), 10)
        assert outcome.ok and outcome.version == 2, outcome
        _, error = await rest(running)
        assert isinstance(error, WorkerUnavailableError) and "reloading to v2" in str(error)
        script.release_streams()
        frames, error = await rest(waiting)
        assert error is None, error
        assert versions(frames) == {2}  # all of it from the new version
        assert text_of(frames) == "t0 t1 t2 t3 t4 " == frames[-1].header["choices"][0]["text"]
        assert old.cancelled == 2  # both stopped in the old worker
        counts = sup.router.counters
        assert (counts.ok, counts.failed) == (1, 1)  # the moved one is not a failure

    body(tmp_path)


@stepped
async def test_at_a_stop_a_stream_not_started_ends_too(make: Make) -> None:
    """No version comes after a stop: every stream in flight ends, naming it."""
    _script, sup, running, waiting = await behind_a_held_stream(make)
    await asyncio.wait_for(sup.stop(), 10)
    for s in (running, waiting):
        _, error = await rest(s)
        assert isinstance(error, WorkerUnavailableError), error


@stepped
async def test_a_moving_stream_whose_client_goes_is_not_sent_again(make: Make) -> None:
    """A stream on its way to the new version ends where its client goes away (or a stop
    comes) before the old worker said it stopped: it is never sent again."""
    script, sup, _running, waiting = await behind_a_held_stream(make)
    script.hold("cancel")  # the old worker's answer to the CANCELs waits
    reload = asyncio.create_task(sup.reload("file"))
    for _ in range(500):
        if script.ops().count("cancel") == 2:
            break
        await asyncio.sleep(0.01)
    assert script.ops().count("cancel") == 2
    waiting.close()  # its client goes while it moves
    script.release("cancel")
    assert (await asyncio.wait_for(reload, 10)).ok
    script.release_streams()
    assert await rest(waiting) == ([], None)
    await asyncio.sleep(0.1)
    texts = [op for _, op in script.log if op == "text"]
    assert len(texts) == 2, script.log  # sent once each, never to the new version


@stepped
async def test_a_moved_stream_counts_its_queue_wait_once(make: Make) -> None:
    """The queue-latency window holds one figure per request: a stream moved to the new
    version is not counted again when it is sent there (its wait in the old worker, up to
    drain_s, is no queue wait)."""
    script, sup, running, waiting = await behind_a_held_stream(make)
    assert (await asyncio.wait_for(sup.reload("file"), 10)).ok
    script.release_streams()
    await rest(running)
    assert (await rest(waiting))[1] is None
    assert sup.router.queue_latency.summary()["count"] == 2


@pytest.mark.parametrize(
    "changes", [{"strategy": "respawn"}, {"policy": "resource"}], ids=["hand-over", "resource"]
)
def test_a_drain_waits_for_streams_it_moves_as_for_those_it_ends(
    tmp_path: Path, changes: dict[str, str]
) -> None:
    """At the drain deadline the only stream left has sent nothing: it waits behind a text
    request that started late. Moved, it stops at its turn; the drain waits for that as it
    waits for an ended stream's next token, not only to drain_wait_s (no wait at all when
    drain_s >= forward_s): the reload goes on, nobody's request fails."""

    @stepped
    async def body(make: Make) -> None:
        script = Script()
        script.stream_step_s = 0.01
        sup = make(script, deadlines=Deadlines(drain_s=0.4, forward_s=0.2), **changes)
        await sup.start()
        long = stream(sup, max_tokens=32)  # ~0.32 s
        text = {"task": "complete", "prompts": ["x"], "sampling": {"max_tokens": 15}}
        plain, _ = sup.router.submit_stoppable({"op": WorkerOp.TEXT, "text": text})
        waiting = stream(sup, max_tokens=3)  # behind both: nothing sent at 0.4 s
        outcome = await asyncio.wait_for(sup.reload("file"), 10)
        assert outcome.ok, outcome
        assert (await rest(long))[1] is None
        assert (await asyncio.wait_for(plain, 10)).header["ok"]
        frames, error = await rest(waiting)
        assert error is None and versions(frames) == {2}

    body(tmp_path)

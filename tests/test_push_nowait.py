"""Pushes made without waiting, and pushes of the changed tensors only, on the client side:
against the small fake session of test_client_push.py on a real Unix socket (the session's
side is tested with the session itself in test_push_delta.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotreload import Client
from hotreload.client import AsyncClient
from hotreload.errors import PushSupersededError, StaleBaseError
from hotreload.protocol.framing import Frame
from hotreload.worker.pushed_state import read_state
from tests.test_client_push import FakeSession


class Pushes:
    """A session's side of update_weights: reads each push (as the worker does), answers
    version 1, 2, ...; `hold` keeps the next answer back until released."""

    made: list[Pushes] = []  # noqa: RUF012  (reset per test by _released)

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []
        self.headers: list[dict[str, Any]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.wait_s = 30.0
        self.arrived = threading.Event()
        self.stale = False
        Pushes.made.append(self)

    def __call__(self, frame: Frame) -> tuple[dict[str, Any], list[Any]]:
        h = frame.header
        self.headers.append(h)
        self.arrived.set()
        if self.stale and h.get("base_digest"):
            error = {"code": StaleBaseError.code, "message": "other weights serve"}
            return {"ok": False, "error": error}, []
        self.states.append(read_state(h["state"], "cpu"))
        self.hold.wait(self.wait_s)  # a failed test's teardown does not wait long
        n = len(self.states)
        return {"ok": True, "version": n, "digest": f"sha256:{n:064x}"}, []


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[[Pushes], Path]]:
    """A fake session answering with `Pushes`; its socket's path."""
    made: list[FakeSession] = []

    def make(pushes: Pushes) -> Path:
        made.append(FakeSession(tmp_path / "s.sock", pushes))
        return tmp_path / "s.sock"

    yield make
    for s in made:
        s.close()


@pytest.fixture(autouse=True)
def _released() -> Any:
    """Every held answer is let go at the end, pass or fail (no thread waits 30 s)."""
    made: list[Pushes] = []
    Pushes.made = made
    yield
    for p in made:
        p.hold.set()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def test_a_push_not_waited_for_returns_a_handle_that_gives_the_reply(fake: Any) -> None:
    pushes = Pushes()
    pushes.hold.clear()
    path = fake(pushes)
    model = _model()
    with Client(socket_path=path) as client:
        handle = client.update_weights("m", model.state_dict(), wait=False)
        assert handle.sent and not handle.done()
        with pytest.raises(TimeoutError, match=r"not served within 0\.05 s"):
            handle.result(0.05)
        pushes.hold.set()
        assert handle.result(30) == {"version": 1, "digest": "sha256:" + "0" * 63 + "1"}
        assert handle.done() and handle.sent_tensors == 4 and handle.skipped_tensors == 0
        assert handle.sent_bytes >= sum(t.numel() * 4 for t in model.state_dict().values())


def test_pushes_made_while_one_builds_collapse_into_the_newest(fake: Any) -> None:
    pushes = Pushes()
    pushes.hold.clear()
    path = fake(pushes)
    model = _model()
    w = model[0].weight
    with Client(socket_path=path) as client:
        first = client.update_weights("m", model.state_dict(), wait=False)
        assert pushes.arrived.wait(30)
        later = []
        for step in range(3):
            with torch.no_grad():
                w.fill_(float(step + 1))
            later.append(client.update_weights("m", model.state_dict(), wait=False))
        # The first builds; the second and third waited as the pending push, in turn.
        assert not later[0].sent and later[0].done() and later[0].superseded_by is later[1]
        with pytest.raises(PushSupersededError, match="replaced by a later one") as info:
            later[1].result(0)
        assert info.value.superseded_by is later[2]
        pushes.hold.set()
        assert first.result(30)["version"] == 1
        assert later[2].result(30)["version"] == 2
    assert len(pushes.headers) == 2  # no backlog: two requests for four pushes
    # What the newest push held when it was made, not what the tensors hold now.
    assert torch.equal(pushes.states[1]["0.weight"], torch.full((16, 8), 3.0))


def test_only_frozen_parameters_unchanged_since_the_served_push_stay_behind(fake: Any) -> None:
    pushes = Pushes()
    path = fake(pushes)
    model = _model()
    model[0].requires_grad_(False)  # frozen: never written again
    opt = torch.optim.AdamW(model[1].parameters(), lr=0.1, fused=True)  # bumps no _version
    table = np.arange(6, dtype=np.int64)

    def state() -> dict[str, Any]:
        return {**model.state_dict(keep_vars=True), "t": table}

    with Client(socket_path=path) as client:
        first = client.update_weights("m", state(), wait=False)
        assert first.result(30)["version"] == 1 and first.sent_tensors == 5
        model(torch.randn(3, 8)).sum().backward()
        opt.step()
        second = client.update_weights("m", state(), wait=False)
        assert second.result(30)["version"] == 2
        assert (second.sent_tensors, second.skipped_tensors) == (3, 2)
        assert sorted(pushes.states[1]) == ["1.bias", "1.weight", "t"]
        h = pushes.headers[1]
        # A delta: not strict on the wire (the first push covered every name), and on top
        # of the weights the first push made.
        assert h["strict"] is False and h["base_digest"] == first.result()["digest"]
        torch.testing.assert_close(pushes.states[1]["1.weight"], model[1].weight.detach())
        # A frozen tensor written in place, or replaced by a new one (equal values), goes.
        with torch.no_grad():
            model[0].bias.mul_(1.0)
        model[0].weight = torch.nn.Parameter(model[0].weight.detach().clone(), False)
        third = client.update_weights("m", state())
        assert third["version"] == 3
        assert sorted(pushes.states[2]) == ["0.bias", "0.weight", "1.bias", "1.weight", "t"]
        client.update_weights("m", state())
        assert sorted(pushes.states[3]) == ["1.bias", "1.weight", "t"]
        # full=True sends everything (a trainer that writes through `.data`); so does a
        # plain state_dict(): detached, no tensor shows it is frozen.
        client.update_weights("m", state(), full=True)
        assert len(pushes.states[4]) == 5 and "base_digest" not in pushes.headers[4]
        client.update_weights("m", model.state_dict())
        assert len(pushes.states[5]) == 4 and "base_digest" not in pushes.headers[5]


def test_a_delta_over_weights_that_no_longer_serve_is_sent_whole(fake: Any) -> None:
    pushes = Pushes()
    path = fake(pushes)
    model = _model()
    model[0].requires_grad_(False)

    def state() -> dict[str, Any]:
        return model.state_dict(keep_vars=True)

    with Client(socket_path=path) as client:
        client.update_weights("m", state())
        with torch.no_grad():
            model[1].bias.add_(1.0)
        pushes.stale = True  # as after the weights files changed
        # Waited for: sent again whole, at once (the caller's tensors did not move).
        assert client.update_weights("m", state())["version"] == 2
        assert len(pushes.states[1]) == 4 and len(pushes.headers) == 3
        with torch.no_grad():
            model[1].bias.add_(1.0)
        pushes.stale = True
        # Not waited for: the handle says so, and the next push goes whole.
        handle = client.update_weights("m", state(), wait=False)
        with pytest.raises(StaleBaseError, match="other weights serve"):
            handle.result(30)
        client.update_weights("m", state(), wait=False).result(30)
        assert len(pushes.states[2]) == 4 and "base_digest" not in pushes.headers[-1]


def test_the_async_client_pushes_without_waiting_too(fake: Any) -> None:
    pushes = Pushes()
    pushes.hold.clear()
    path = fake(pushes)
    model = _model()

    async def main() -> tuple[Any, ...]:
        async with AsyncClient(socket_path=path) as client:
            first = await client.update_weights("m", model.state_dict(), wait=False)
            second = await client.update_weights("m", model.state_dict(), wait=False)
            third = await client.update_weights("m", model.state_dict(), wait=False)
            pushes.hold.set()
            return await first, second, await third

    first, second, third = asyncio.run(asyncio.wait_for(main(), 60))
    assert first["version"] == 1 and third["version"] == 2
    assert second.superseded_by is not None and len(pushes.headers) == 2

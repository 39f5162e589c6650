"""Long forwards and given-up requests: a drain never kills a worker for a forward shorter
than `forward_s`, and a request whose client gave up is answered, never computed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from hotreload import Client
from hotreload.errors import RequestTimeoutError
from tests.support import ServeProcess, count_events, make_project, shared_server, wait_until

#: Sleeps x[0, 0] seconds and writes down every value it computed, so a test can tell
#: which requests ran.
LOGGING_MODEL = """
import time
from pathlib import Path

import torch

LOG = Path(__file__).with_name("computed.log")

class Sleepy(torch.nn.Module):
    def forward(self, x):
        first = float(x[0, 0])
        with LOG.open("a") as f:
            f.write(f"{first}\\n")
        time.sleep(min(max(first, 0.0), 30.0))
        return x * 2

def build():
    return Sleepy()

def example():
    return torch.zeros(1, 4)
"""


def sleepy_project(tmp_path: Path, strategy: str = "inplace", **deadlines: float) -> Path:
    table = "".join(f"{k} = {v}\n" for k, v in deadlines.items())
    config = f"""
[[models]]
name = "sleepy"
entry = "sleepy.py:build"
example = "sleepy.py:example"
warmup_iters = 1
threads = 1
max_inflight = 4
strategy = "{strategy}"
[models.deadlines]
{table}"""
    return make_project(tmp_path, config=config, files={"sleepy.py": LOGGING_MODEL})


def computed(config: Path) -> list[float]:
    log = config.parent / "computed.log"
    return [float(v) for v in log.read_text().split()] if log.exists() else []


def marked(value: float) -> np.ndarray:
    x = np.zeros((1, 4), np.float32)
    x[0, 0] = value
    return x


class Sleepy(NamedTuple):
    config: Path
    session: ServeProcess


@pytest.fixture(scope="module")
def inplace_sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sleepy]:
    """One `inplace` session of the sleepy model for the module's tests (its start is most
    of a test): drain_s and sync_s far below the forwards, forward_s (20) above them."""
    config = sleepy_project(
        tmp_path_factory.mktemp("sleepy"), "inplace", drain_s=0.3, sync_s=0.3, forward_s=20
    )
    with shared_server(config) as session:
        yield Sleepy(config, session)


def a_forward_longer_than_drain_s_finishes_and_the_reload_goes_through(
    config: Path, strategy: str
) -> None:
    client = Client(config=config, timeout_s=60)
    before = client.status()["models"][0]
    pid, wedged = before["pid"], count_events(config, "wedged")
    answers: list[object] = []

    def long_forward() -> None:
        try:
            answers.append(client.infer("sleepy", marked(2.5)))
        except Exception as exc:
            answers.append(exc)

    t = threading.Thread(target=long_forward)
    t.start()
    wait_until(lambda: 2.5 in computed(config), 30, what="the long forward to start")
    outcome = Client(config=config, timeout_s=60).reload("sleepy", force=True)["outcomes"][0]
    t.join(60)
    assert not t.is_alive()
    assert outcome["ok"] is True, outcome
    out, version, _ = answers[0]  # type: ignore[misc]
    assert version == before["version"] and out.tolist() == (marked(2.5) * 2).tolist()
    assert count_events(config, "wedged") == wedged
    status = client.status()["models"][0]
    assert status["version"] == before["version"] + 1
    assert status["restarts"] == before["restarts"]
    if strategy == "inplace":
        assert status["pid"] == pid  # the worker was never killed as hung


def test_a_forward_longer_than_drain_s_finishes_and_the_inplace_reload_goes_through(
    inplace_sleepy: Sleepy,
) -> None:
    a_forward_longer_than_drain_s_finishes_and_the_reload_goes_through(
        inplace_sleepy.config, "inplace"
    )


def test_a_forward_longer_than_drain_s_finishes_and_the_respawn_reload_goes_through(
    tmp_path: Path, serve
) -> None:
    # drain_s and sync_s far below the forward: the drain must still wait (forward_s is 20).
    config = sleepy_project(tmp_path, "respawn", drain_s=0.3, sync_s=0.3, forward_s=20)
    serve(config)
    a_forward_longer_than_drain_s_finishes_and_the_reload_goes_through(config, "respawn")


def test_requests_whose_client_gave_up_are_never_computed(inplace_sleepy: Sleepy) -> None:
    config = inplace_sleepy.config
    client = Client(config=config, timeout_s=60)
    hold = threading.Thread(target=lambda: client.infer("sleepy", marked(2.0)))
    hold.start()
    wait_until(lambda: 2.0 in computed(config), 30, what="the long forward to start")
    # Three fit the in-flight window and wait inside the worker; two more wait in the queue.
    # Each client gives up after 0.5 s, long before the 2 s forward ends.
    impatient = Client(config=config, timeout_s=0.5)
    errors: list[BaseException] = []

    def give_up(value: float) -> None:
        try:
            impatient.infer("sleepy", marked(value))
        except Exception as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=give_up, args=(0.0625 * i,)) for i in range(1, 6)]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join(30)
    hold.join(30)
    assert not hold.is_alive()
    assert len(errors) == 5 and all(isinstance(e, RequestTimeoutError) for e in errors), errors
    out, _, _ = client.infer("sleepy", marked(0.0))
    assert out.tolist() == [[0.0] * 4]
    # Only the long forward, the warm-up/smoke passes and the last request were computed.
    # (Multiples of 1/16: exact in float32, so the log shows them as sent.)
    assert not {0.0625 * i for i in range(1, 6)} & set(computed(config)), computed(config)

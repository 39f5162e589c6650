"""`hotreload serve` end to end: real processes, real sockets, the example model on CPU."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import psutil
import pytest
import torch

from hotreload import AsyncClient, Client
from hotreload.errors import (
    BadRequestError,
    ModelError,
    NoServerError,
    QueueFullError,
    RequestTimeoutError,
    WorkerUnavailableError,
)
from hotreload.protocol.framing import pack_frame, read_frame_sync
from tests.support import ServeProcess, make_project, shared_server, wait_until

SLOW_MODEL = '''
import time
import torch

class Slow(torch.nn.Module):
    """Sleeps x[0, 0] seconds; x[0, 0] == -1000 raises; returns x * 2."""

    def forward(self, x):
        first = float(x[0, 0])
        if first == -1000:
            raise ValueError("refusing -1000 on purpose")
        if first > 0:
            time.sleep(min(first, 30.0))
        return x * 2

def build():
    return Slow()

def example():
    return torch.zeros(1, 4)
'''

SLOW_CONFIG = """
[[models]]
name = "slow"
entry = "slow.py:build"
example = "slow.py:example"
max_queue_size = 2
max_inflight = 1
request_timeout_s = 5
warmup_iters = 1
threads = 1
"""


def slow_project(tmp_path: Path, extra: str = "") -> Path:
    return make_project(tmp_path, config=SLOW_CONFIG + extra, files={"slow.py": SLOW_MODEL})


class Served(NamedTuple):
    config: Path
    session: ServeProcess


def shared_session(config: Path) -> Iterator[Served]:
    """One `hotreload serve` of `config` for the tests of the module that only send to it
    (a session's start is most of such a test)."""
    with shared_server(config) as session:
        yield Served(config, session)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The example served; its tests leave it serving v1 (a restarted worker included)."""
    yield from shared_session(make_project(tmp_path_factory.mktemp("example")))


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The slow model served (max_inflight 1, a queue of 2); its tests wait for their own
    requests, so each finds it idle."""
    yield from shared_session(slow_project(tmp_path_factory.mktemp("slow")))


def x_with(first: float) -> np.ndarray:
    x = np.zeros((1, 4), dtype=np.float32)
    x[0, 0] = first
    return x


def reference_output(config: Path, x: np.ndarray) -> np.ndarray:
    """What the example computes, in this process, from the same code and weights."""
    sys.path.insert(0, str(config.parent))
    try:
        import importlib

        import model as example_model

        importlib.reload(example_model)
        from safetensors.torch import load_file

        m = example_model.build()
        m.load_state_dict(load_file(str(config.parent / "weights.safetensors")))
        with torch.inference_mode():
            return m.eval()(torch.from_numpy(x)).numpy()
    finally:
        sys.path.remove(str(config.parent))
        sys.modules.pop("model", None)


def test_serve_example_and_infer(example: Served) -> None:
    project, session = example
    assert "mlp: v1 ready on cpu" in session.output
    client = Client(config=project)
    x = np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32)
    out, version, model = client.infer("mlp", x)
    assert (version, model) == (1, "mlp")
    assert out.shape == (3, 10) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference_output(project, x), rtol=1e-4, atol=1e-5)
    # A torch tensor goes in just as well, and the model name may be omitted with one model.
    out2, _, _ = client.infer(None, torch.from_numpy(x))
    np.testing.assert_array_equal(out, out2)

    async def via_async() -> tuple[np.ndarray, int]:
        async with AsyncClient(config=project) as ac:
            results = await asyncio.gather(*(ac.infer("mlp", x) for _ in range(20)))
        assert {r.version for r in results} == {1}
        return results[0].output, results[0].version

    aout, _ = asyncio.run(via_async())
    np.testing.assert_array_equal(aout, out)


def test_status_reports_figures(example: Served) -> None:
    project = example.config
    client = Client(config=project)
    for _ in range(5):
        client.infer("mlp", np.zeros((1, 64), np.float32))
    status = client.status()
    (m,) = status["models"]
    assert m["state"] == "serving" and m["version"] == 1 and m["queue_limit"] == 256
    assert m["requests"]["ok"] >= 5 and m["latency"]["p99_ms"] > 0
    assert (
        m["worker"]["rss_bytes"] > 10 * 2**20 and m["load_s"] > 0 and len(m["warm_passes_ms"]) == 3
    )
    assert m["worker"]["threads"] == {"intra_op": 1, "inter_op": 1}
    from hotreload.cli import main

    assert main(["status", "--config", str(project)]) == 0
    # One model by name (what completion offers), and a name the session does not serve.
    assert main(["status", "mlp", "--config", str(project)]) == 0
    assert main(["status", "nope", "--config", str(project)]) == 2


def test_status_says_why_cpus_auto_pinned_nothing(
    tmp_path: Path, serve, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("threads = 1", "# threads unset"))
    serve(config)
    (m,) = Client(config=config).status()["models"]
    assert m["cpus"] is None and "`threads` is not set" in m["cpus_unpinned"]
    assert m["cpus_unpinned_short"] == "threads unset"
    from hotreload.cli import main

    assert main(["status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "  not pinned to CPUs of its own: `threads` is not set" in out


def test_queue_full_rejects_at_once_with_depth_and_limit(slow: Served) -> None:
    config = slow.config
    client = Client(config=config)
    results: list[object] = []

    def send() -> None:
        try:
            results.append(client.infer("slow", x_with(1.0)))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    rejected = [r for r in results if isinstance(r, QueueFullError)]
    served = [r for r in results if not isinstance(r, Exception)]
    # One in flight + two queued fit; the rest are turned away at once.
    assert len(rejected) >= 2 and len(served) >= 2, results
    assert "Exceeds maximum queue size (depth 2, limit 2)" in str(rejected[0])


def test_request_timeout_is_an_error_not_a_hang(slow: Served) -> None:
    config = slow.config
    client = Client(config=config)
    t0 = time.monotonic()
    with pytest.raises(RequestTimeoutError, match=r"timed out after 0\.3 s"):
        client.infer("slow", x_with(2.0), timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0
    out, version, _ = client.infer("slow", x_with(0.0))
    assert out.tolist() == [[0, 0, 0, 0]] and version == 1


def test_model_error_carries_remote_traceback_and_server_survives(slow: Served) -> None:
    config = slow.config
    client = Client(config=config)
    with pytest.raises(ModelError) as info:
        client.infer("slow", x_with(-1000))
    assert "refusing -1000 on purpose" in str(info.value)
    assert info.value.remote_traceback and "slow.py" in info.value.remote_traceback
    assert client.infer("slow", x_with(0.5))[0][0, 0] == 1.0


def test_wrong_dtype_shape_and_model_are_bad_requests(example: Served) -> None:
    project = example.config
    client = Client(config=project)
    with pytest.raises(BadRequestError, match="expected dtype float32, got int64"):
        client.infer("mlp", np.zeros((1, 64), np.int64))
    # numpy's default float64, the usual slip: the answer says how to convert it.
    with pytest.raises(BadRequestError) as info:
        client.infer("mlp", np.zeros((1, 64)))
    assert str(info.value).endswith(
        "input: expected dtype float32, got float64; convert it with .astype(np.float32) "
        "before sending (a torch tensor: .to(torch.float32))"
    )
    with pytest.raises(
        BadRequestError, match=r"expected shape \[N, 64\] \(dimension 0 may vary\), got \[1, 32\]"
    ):
        client.infer("mlp", np.zeros((1, 32), np.float32))
    with pytest.raises(BadRequestError, match="expected one input tensor, got 2"):
        client.infer(
            "mlp", {"a": np.zeros((1, 64), np.float32), "b": np.zeros((1, 64), np.float32)}
        )
    with pytest.raises(BadRequestError, match="unknown model 'nope'; this session serves: mlp"):
        client.infer("nope", np.zeros((1, 64), np.float32))
    assert client.infer("mlp", np.zeros((2, 64), np.float32))[0].shape == (2, 10)


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    return s


def test_garbage_and_oversized_frames_then_a_good_request(example: Served) -> None:
    project = example.config
    client = Client(config=project)
    path = client.socket_path
    cases = [
        struct.pack(">I", 12) + b"\x00\x00\x00\x08not json",
        struct.pack(">I", 1 << 30),  # 1 GiB: over the 64 MiB limit
        struct.pack(">I", 2) + b"ab",
        b"".join(
            pack_frame(
                {
                    "op": "infer",
                    "model": "mlp",
                    "tensors": [{"name": "x", "dtype": "float32", "shape": [1, 64], "nbytes": 256}],
                }
            )
        ),
        b"".join(pack_frame({"op": "launch_missiles"})),
    ]
    expected = [
        "not valid JSON",
        "exceeds the maximum frame size",
        "too small",
        "payload has 0 bytes",
        "unknown op",
    ]
    for raw, message in zip(cases, expected, strict=True):
        with _raw(path) as s:
            s.sendall(raw)
            reply = read_frame_sync(s, 1 << 20)
        assert reply.header["ok"] is False and reply.header["error"]["code"] == "bad_request"
        assert message in reply.header["error"]["message"]
    # A client that hangs up mid-frame does no harm either.
    with _raw(path) as s:
        s.sendall(struct.pack(">I", 100) + b"\x00\x00")
    out, version, _ = client.infer("mlp", np.ones((1, 64), np.float32))
    assert out.shape == (1, 10) and version == 1


def test_socket_is_private(example: Served) -> None:
    project = example.config
    path = Client(config=project).socket_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.parent.stat().st_uid == os.getuid()


def test_long_project_path_still_serves(tmp_path: Path, serve) -> None:
    deep = tmp_path.joinpath(*(["a-rather-long-folder-name"] * 8))
    deep.mkdir(parents=True)
    config = make_project(deep)
    assert len(str(config)) > 200
    serve(config)
    assert Client(config=config).infer("mlp", np.zeros((1, 64), np.float32)).version == 1


def test_no_server_is_a_clear_error(project: Path) -> None:
    with pytest.raises(NoServerError, match="hotreload serve"):
        Client(config=project).infer("mlp", np.zeros((1, 64), np.float32))
    from hotreload.cli import main

    assert main(["status", "--config", str(project)]) == 3


def test_worker_killed_under_load_is_restarted_and_no_request_hangs(example: Served) -> None:
    project, session = example
    client = Client(config=project, timeout_s=30)
    pid_before = client.status()["models"][0]["pid"]
    restarts = client.status()["models"][0]["restarts"]
    said = session.output.count("worker restarted")
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        x = np.zeros((1, 64), np.float32)
        while not stop.is_set():
            try:
                client.infer("mlp", x)
                outcomes.append("ok")
            except WorkerUnavailableError:
                outcomes.append("failed")  # explicit failure is allowed; a hang is not

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(outcomes) > 50, 30, what="steady traffic")
    os.kill(pid_before, signal.SIGKILL)
    wait_until(lambda: session.output.count("worker restarted") > said, 60, what="worker restart")
    n = len(outcomes)
    wait_until(lambda: len(outcomes) > n + 50, 30, what="traffic after restart")
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a client thread hung"
    status = client.status()["models"][0]
    assert status["restarts"] == restarts + 1 and status["pid"] != pid_before
    assert status["state"] == "serving"
    assert (
        not psutil.pid_exists(pid_before)
        or psutil.Process(pid_before).status() == psutil.STATUS_ZOMBIE
    )
    assert outcomes.count("ok") > 100


def test_sigterm_drains_and_leaves_no_process(tmp_path: Path, serve) -> None:
    config = slow_project(tmp_path)
    session = serve(config)
    workers = session.worker_pids()
    assert workers, "a worker process should be running"
    client = Client(config=config)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(client.infer("slow", x_with(0.5))))
    t.start()
    time.sleep(0.2)  # the request is inside the worker now
    assert session.stop(signal.SIGTERM) == 0
    t.join(10)
    assert result and not isinstance(result[0], Exception), (
        "in-flight request was drained, not dropped"
    )
    assert "stopped" in session.output
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not client.socket_path.exists()


def test_model_that_fails_to_load_exits_1_with_the_error(tmp_path: Path, serve) -> None:
    config = make_project(
        tmp_path,
        files={
            "model.py": "def build():\n    raise RuntimeError('bad build')\n\n"
            "def example_input():\n    return 0\n"
        },
    )
    session = serve(config, wait_ready=False)
    assert session.proc.wait(60) == 1
    session.wait_for("bad build")
    assert "failed to start in load" in session.output


def test_second_session_on_the_same_config_leaves_the_first_one_serving(
    example: Served, serve
) -> None:
    project, first = example
    client = Client(config=project)
    assert client.infer("mlp", np.zeros((1, 64), np.float32)).version == 1
    second = serve(project, wait_ready=False)
    assert second.proc.wait(60) == 3
    second.wait_for("already serving")
    # Where the refused session would have run is no news: no placement line before it.
    assert "cpus:" not in second.output, second.output
    # The refused session must not remove the socket of the one that is serving.
    assert first.proc.poll() is None and client.socket_path.exists()
    with Client(config=project) as fresh:
        assert fresh.infer("mlp", np.zeros((1, 64), np.float32)).version == 1


def test_second_watch_no_tui_exits_3_and_never_touches_the_live_sessions_state(
    project: Path, serve
) -> None:
    first = serve(project, command="watch")
    events = project.parent / ".hotreload" / "events.jsonl"
    session_file = project.parent / ".hotreload" / "session.json"
    before_events, before_session = events.read_bytes(), session_file.read_bytes()
    second = serve(project, "--no-tui", command="watch", wait_ready=False)
    assert second.proc.wait(60) == 3, second.output
    second.wait_for("already serving")
    assert "stop it first" in second.output and "could not start" not in second.output
    # Not a line of the refused session lands in the live one's events, nor its session file.
    after = events.read_bytes()
    assert after.startswith(before_events)
    new_kinds = [json.loads(line)["kind"] for line in after[len(before_events) :].splitlines()]
    assert not [k for k in new_kinds if k.startswith("session_") or k == "state"], new_kinds
    assert session_file.read_bytes() == before_session
    assert first.proc.poll() is None
    with Client(config=project) as client:
        assert client.infer("mlp", np.zeros((1, 64), np.float32)).version == 1


def test_ctrl_c_during_a_long_first_load_stops_at_once(tmp_path: Path, serve) -> None:
    config = make_project(
        tmp_path,
        config=(
            '[[models]]\nname = "slow"\nentry = "slowload.py:build"\n'
            'example = "slowload.py:example"\n'
        ),
        files={
            "slowload.py": "import time\nimport torch\n\ndef build():\n    time.sleep(60)\n"
            "    return torch.nn.Identity()\n\ndef example():\n    return torch.zeros(1, 4)\n"
        },
    )
    session = serve(config, wait_ready=False)
    session.wait_for("no GPU data", 60)  # the session is up; the worker is loading
    time.sleep(1.0)  # the worker is inside build() now
    t0 = time.monotonic()
    assert session.stop(signal.SIGINT, timeout=30) == 0
    assert time.monotonic() - t0 < 25, "the stop waited for the 60 s load"
    assert "stopping before the models were ready" in session.output


BROKEN_AT_START = """
import torch

def build():
    return undefined_name  # fixed by the test once the session serves the other model

def example():
    return torch.ones(1, 4)
"""


def test_a_model_that_fails_at_start_never_takes_the_others_down(tmp_path: Path, serve) -> None:
    config = make_project(tmp_path)
    config.write_text(
        config.read_text() + '\n[[models]]\nname = "broken"\nentry = "broken.py:build"\n'
        'example = "broken.py:example"\nthreads = 1\nwarmup_iters = 1\n'
    )
    (config.parent / "broken.py").write_text(BROKEN_AT_START)
    session = serve(config)
    session.wait_for("1 model(s) failed to start and answer with why: broken")
    assert "serving 1 model(s)" in session.output and session.proc.poll() is None
    client = Client(config=config, timeout_s=30)
    x = np.zeros((1, 64), np.float32)
    assert client.infer("mlp", x).version == 1
    with pytest.raises(WorkerUnavailableError, match=r"failed to start .*NameError"):
        client.infer("broken", np.ones((1, 4), np.float32))
    # Fixed and reloaded: it comes up beside the model that kept serving.
    fixed = BROKEN_AT_START.replace("undefined_name", "torch.nn.Identity()")
    (config.parent / "broken.py").write_text(fixed)
    outcome = client.reload("broken")["outcomes"][0]
    assert outcome["ok"], outcome
    out, _, _ = client.infer("broken", np.ones((1, 4), np.float32))
    assert out.tolist() == [[1.0] * 4]
    assert client.infer("mlp", x).version == 1


def test_serve_exits_1_when_no_model_can_start(tmp_path: Path, serve) -> None:
    config = make_project(
        tmp_path,
        config='[[models]]\nname = "broken"\nentry = "broken.py:build"\n'
        'example = "broken.py:example"\nthreads = 1\n',
        files={"broken.py": BROKEN_AT_START},
    )
    session = serve(config, wait_ready=False)
    assert session.proc.wait(120) == 1
    assert "NameError" in session.output

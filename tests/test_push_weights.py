"""A trainer pushes weights from memory: `Client.update_weights`, end to end.

A real `hotreload serve` of the example MLP, a real client pushing torch tensors through a
memfd, and the model called in-process with the same weights to compare the answers with.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch

from hotreload import Client
from hotreload.errors import ReloadFailedError, RequestTimeoutError
from hotreload.worker.weights_digest import state_digest
from tests.support import ServeProcess, count_events, make_project, shared_server, wait_until

X = np.random.default_rng(17).standard_normal((2, 64), dtype=np.float32)


def in_process(config: Path, state: dict[str, torch.Tensor]) -> np.ndarray:
    """The example model, built here, with `state`: what the server must answer."""
    spec = importlib.util.spec_from_file_location("mlp_here", config.parent / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.set_num_threads(1)
    model = module.build().eval()
    model.load_state_dict(state)
    with torch.inference_mode():
        return model(torch.from_numpy(X)).numpy()


def file_state(config: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(config.parent / "weights.safetensors"))


def trained(state: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """A training step's worth of change, the same every run."""
    g = torch.Generator().manual_seed(step)
    return {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in state.items()}


def status_of(client: Client) -> dict[str, Any]:
    return client.status()["models"][0]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, ServeProcess, Client]]:
    """One session of the example for the module's tests (its start is most of a test):
    each test starts where the one before left it, its versions counted from there."""
    config = make_project(tmp_path_factory.mktemp("push-weights"))
    with shared_server(config) as server, Client(config=config, timeout_s=60) as client:
        yield config, server, client


def test_a_weights_file_saved_again_with_the_same_bytes_builds_nothing_unless_pushes_lie_over_it(
    served,
) -> None:  # type: ignore[no-untyped-def]
    """Issue 30, 13: a reload whose code and weights digest are the serving version's is a
    no-op, whichever stamp the file has; but over pushed weights the same save goes back to
    the file's weights (the pushes are dropped), so it builds. First in the module: the
    file's weights serve, no push over them."""
    config, _, client = served
    weights = config.parent / "weights.safetensors"
    start = status_of(client)
    v1 = start["digest"]
    assert start["version"] == 1 and start["pushes"] == 0
    assert v1 == state_digest(file_state(config))
    weights.write_bytes(weights.read_bytes())  # a new stamp, the same bytes
    outcome = client.reload("mlp")["outcomes"][0]
    assert outcome["ok"] and status_of(client)["version"] == start["version"], outcome
    assert outcome["unchanged"], outcome
    changed = trained(file_state(config), 4)
    safetensors.torch.save_file(changed, str(weights))
    client.reload("mlp")
    assert status_of(client)["version"] == start["version"] + 1
    weights.write_bytes(weights.read_bytes())  # v2's bytes again: hashed once v2 served
    client.reload("mlp")
    assert status_of(client)["version"] == start["version"] + 1
    client.update_weights("mlp", trained(changed, 5))  # v3: a push over v2's file
    weights.write_bytes(weights.read_bytes())
    client.reload("mlp")
    now = status_of(client)
    assert now["version"] == start["version"] + 3 and now["pushes"] == 0, now
    np.testing.assert_allclose(
        client.infer("mlp", X).output, in_process(config, changed), rtol=1e-5, atol=1e-6
    )
    assert v1 != now["digest"]


def test_a_push_serves_the_pushed_weights_and_says_which(served) -> None:  # type: ignore[no-untyped-def]
    config, _, client = served
    before = status_of(client)
    v = before["version"]
    assert before["digest"].startswith("sha256:")
    done = count_events(config, "reload_done", trigger="push")
    state = trained(file_state(config), 1)
    reply = client.update_weights("mlp", state)
    assert reply["version"] == v + 1 and reply["digest"] != before["digest"]
    result = client.infer("mlp", X, min_version=v + 1)
    assert result.version == v + 1 and result.digest == reply["digest"]
    np.testing.assert_allclose(result.output, in_process(config, state), rtol=1e-5, atol=1e-6)
    now = status_of(client)
    assert now["digest"] == reply["digest"] and now["pushes"] == 1
    # The file's own weights pushed back: the digest of the version that read them from the
    # file, however they arrived (the first test: that version's is this digest).
    again = client.update_weights("mlp", file_state(config))
    assert again["digest"] == state_digest(file_state(config)) and again["version"] == v + 2
    assert count_events(config, "reload_done", trigger="push") == done + 2


def test_a_partial_push_keeps_the_rest_of_the_last_push(served) -> None:  # type: ignore[no-untyped-def]
    config, _, client = served
    first = trained(file_state(config), 1)
    full = client.update_weights("mlp", first)["version"]
    head = {k: v * 0.5 for k, v in first.items() if k.startswith("out.")}
    with pytest.raises(ReloadFailedError, match="strict=False"):
        client.update_weights("mlp", head)  # strict: every tensor, or say so
    reply = client.update_weights("mlp", head, strict=False)
    assert reply["version"] == full + 1
    expected = in_process(config, {**first, **head})
    np.testing.assert_allclose(client.infer("mlp", X).output, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: {**s, "out.weight": torch.zeros(3, 3)}, r"out\.weight has shape \[3, 3\]"),
        (lambda s: {**s, "head.weight": torch.zeros(3)}, "does not have: head.weight"),
        (lambda s: {**s, "out.bias": torch.full_like(s["out.bias"], float("nan"))}, "non-finite"),
    ],
    ids=["shape", "unknown name", "nan output"],
)
def test_a_bad_push_raises_why_and_the_old_weights_serve_on(served, change, message) -> None:  # type: ignore[no-untyped-def]
    config, _, client = served
    good = trained(file_state(config), 2)
    v = client.update_weights("mlp", good)["version"]
    before = client.infer("mlp", X)
    with pytest.raises(ReloadFailedError, match=message) as failed:
        client.update_weights("mlp", change(good))
    assert f"v{v} keeps serving" in str(failed.value)
    after = client.infer("mlp", X)
    assert after.version == v and after.digest == before.digest
    np.testing.assert_array_equal(after.output, before.output)  # never a mix


def test_a_restart_and_a_code_edit_keep_the_pushed_weights(served) -> None:  # type: ignore[no-untyped-def]
    config, server, client = served
    restarts = count_events(config, "worker_restarted")
    state = trained(file_state(config), 3)
    pushed = client.update_weights("mlp", state)["digest"]
    expected = in_process(config, state)
    os.kill(server.worker_pids()[0], signal.SIGKILL)  # a crash: the worker is restarted
    wait_until(
        lambda: count_events(config, "worker_restarted") == restarts + 1, 60, what="the restart"
    )
    after_crash = client.infer("mlp", X)
    assert after_crash.digest == pushed
    np.testing.assert_allclose(after_crash.output, expected, rtol=1e-5, atol=1e-6)
    model_py = config.parent / "model.py"
    model_py.write_text(model_py.read_text() + "\n# an edit of the code only\n")
    outcome = client.reload("mlp")["outcomes"][0]
    assert outcome["ok"], outcome
    edited = client.infer("mlp", X)
    assert edited.version > after_crash.version and edited.digest == pushed


def test_min_version_waits_for_the_push_and_wait_version_is_bounded(served) -> None:  # type: ignore[no-untyped-def]
    config, _, client = served
    v = status_of(client)["version"] + 1
    answers: list[Any] = []
    other = Client(config=config, timeout_s=60)
    waiter = threading.Thread(target=lambda: answers.append(other.infer("mlp", X, min_version=v)))
    waiter.start()
    # It waits in the session for the next version (not answered by this one, not refused).
    wait_until(lambda: status_of(client)["waiting_for_version"] == 1, 30, what="the wait")
    state = trained(file_state(config), 4)
    reply = client.update_weights("mlp", state)
    waiter.join(60)
    assert answers and answers[0].version == v and answers[0].digest == reply["digest"]
    other.close()
    assert client.wait_version("mlp", v) == v
    with pytest.raises(RequestTimeoutError, match=f"version {v + 3} did not serve"):
        client.wait_version("mlp", v + 3, timeout_s=0.5)


def test_a_full_push_lets_go_of_the_pushes_it_replaces(served) -> None:  # type: ignore[no-untyped-def]
    """Found by benchmarks/train_eval.py: 52 pushes of 17 MiB left 887 MiB of memfds held."""
    config, server, client = served
    state = file_state(config)
    for step in range(6):
        client.update_weights("mlp", trained(state, step))
    head = {k: v for k, v in trained(state, 9).items() if k.startswith("out.")}
    client.update_weights("mlp", head, strict=False)
    assert status_of(client)["pushes"] == 2  # the last full push, and the partial one on it

    def memfds() -> int:
        fds = Path(f"/proc/{server.proc.pid}/fd")
        return sum("memfd:hotreload-state" in os.readlink(fd) for fd in fds.iterdir())

    wait_until(lambda: memfds() == 2, 10, what="the replaced pushes' memory let go")

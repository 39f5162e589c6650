"""Under strategy `respawn`, a push builds in the standby, not in the serving worker.

Issue 26 item 2: no push may run its read, digest or build in the serving process. A real
`hotreload serve` of the example MLP with `strategy = "respawn"`: each push is built,
digested, warmed and smoke-tested in the standby over the serving worker's weights block
(no file read), then handed over to; the old worker becomes the next standby. The answers
are compared with the model called in-process on the same weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from hotreload import Client
from hotreload.errors import ReloadFailedError
from tests.support import ServeProcess, make_project, read_events, shared_server, wait_until
from tests.test_push_weights import X, file_state, in_process, status_of, trained


class Respawned(NamedTuple):
    config: Path
    server: ServeProcess
    client: Client
    #: The digest of the weights file's own weights: v1's.
    file_digest: str


@pytest.fixture(scope="module")
def respawned_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Respawned]:
    """One session for the module's tests of the example (a process start and a standby's
    are most of each test): each test starts from where the one before left it."""
    config = make_project(tmp_path_factory.mktemp("push-standby"))
    config.write_text(config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"'))
    with shared_server(config) as server, Client(config=config, timeout_s=60) as client:
        yield Respawned(config, server, client, status_of(client)["digest"])


@pytest.fixture
def respawned(respawned_session: Respawned) -> Respawned:
    """The module's session once its standby is up."""
    client = respawned_session.client
    wait_until(lambda: status_of(client)["standby"] is not None, 60, what="the standby")
    return respawned_session


def push_rows(config: Path) -> list[dict[str, Any]]:
    return [
        e for e in read_events(config) if e.get("kind") == "reload_done" and e["trigger"] == "push"
    ]


def test_a_push_builds_in_the_standby_and_the_old_worker_becomes_the_next(
    respawned: Respawned,
) -> None:
    config, _, client, _ = respawned
    before = status_of(client)
    rows = len(push_rows(config))
    serving, standby = before["pid"], before["standby"]["pid"]
    state = trained(file_state(config), 1)
    reply = client.update_weights("mlp", state)
    result = client.infer("mlp", X, min_version=reply["version"])
    assert result.version == reply["version"] == before["version"] + 1
    assert result.digest == reply["digest"]
    np.testing.assert_allclose(result.output, in_process(config, state), rtol=1e-5, atol=1e-6)
    after = status_of(client)
    assert after["pid"] == standby, "the standby built the push and serves it"
    wait_until(
        lambda: (status_of(client)["standby"] or {}).get("pid") == serving,
        60,
        what="the old serving worker kept as the next standby",
    )
    (row,) = push_rows(config)[rows:]
    assert row["strategy"] == "respawn" and "swap" in row["phases"], row


def test_pushes_in_the_standby_lay_over_each_other_in_order(respawned: Respawned) -> None:
    """A subset push goes over the full push before it, in a worker that never read either:
    the standby maps the block and both pushes again."""
    config, _, client, v1 = respawned
    first = trained(file_state(config), 5)
    client.update_weights("mlp", first)
    wait_until(lambda: status_of(client)["standby"] is not None, 60, what="the next standby")
    head = {k: v * 0.5 for k, v in first.items() if k.startswith("out.")}
    reply = client.update_weights("mlp", head, strict=False)
    result = client.infer("mlp", X, min_version=reply["version"])
    assert result.digest == reply["digest"]
    expected = in_process(config, {**first, **head})
    np.testing.assert_allclose(result.output, expected, rtol=1e-5, atol=1e-6)
    # The file's own weights pushed back give the first version's digest: content, not path.
    again = client.update_weights("mlp", file_state(config))
    assert again["digest"] == v1
    assert all(r["strategy"] == "respawn" for r in push_rows(config))


def test_a_push_that_fails_in_the_standby_leaves_the_old_weights_serving(
    respawned: Respawned,
) -> None:
    config, _, client, _ = respawned
    good = trained(file_state(config), 2)
    v = client.update_weights("mlp", good)["version"]
    before = client.infer("mlp", X)
    bad = {**good, "out.bias": torch.full_like(good["out.bias"], float("nan"))}
    with pytest.raises(ReloadFailedError, match="non-finite") as failed:
        client.update_weights("mlp", bad)
    assert f"v{v} keeps serving" in str(failed.value)
    after = client.infer("mlp", X)
    assert after.version == v and after.digest == before.digest
    np.testing.assert_array_equal(after.output, before.output)  # never a mix
    # And the next good push still builds off the serving worker.
    wait_until(lambda: status_of(client)["standby"] is not None, 60, what="a standby again")
    serving = status_of(client)["pid"]
    reply = client.update_weights("mlp", trained(good, 3))
    assert reply["version"] == v + 1 and status_of(client)["pid"] != serving


def test_a_model_without_weights_files_builds_pushes_in_the_standby_once_one_holds_every_tensor(
    tmp_path: Path, serve
) -> None:  # type: ignore[no-untyped-def]
    """A trainer's model built from its config (no weights file): the standby has no block
    to map, so a push builds there only over a push of every tensor (strict); a subset
    before that builds in the serving worker and says why."""
    config = make_project(tmp_path)
    text = config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"')
    config.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("weights")))
    serve(config)
    with Client(config=config, timeout_s=60) as client:
        wait_until(lambda: status_of(client)["standby"] is not None, 60, what="the standby")
        state = trained(file_state(config), 7)
        head = {k: v * 0.5 for k, v in state.items() if k.startswith("out.")}
        client.update_weights("mlp", head, strict=False)  # over build()'s own values
        (row,) = push_rows(config)
        assert row["strategy"] == "inplace", row
        standby = status_of(client)["standby"]["pid"]
        reply = client.update_weights("mlp", state)
        assert status_of(client)["pid"] == standby, "built in the standby"
        result = client.infer("mlp", X, min_version=reply["version"])
        assert result.digest == reply["digest"]
        np.testing.assert_allclose(result.output, in_process(config, state), rtol=1e-5, atol=1e-6)
        wait_until(lambda: status_of(client)["standby"] is not None, 60, what="the next standby")
        reply = client.update_weights("mlp", head, strict=False)
        result = client.infer("mlp", X, min_version=reply["version"])
        expected = in_process(config, {**state, **head})
        np.testing.assert_allclose(result.output, expected, rtol=1e-5, atol=1e-6)
        assert [r["strategy"] for r in push_rows(config)] == ["inplace", "respawn", "respawn"]


def hashed_kib(config: Path) -> list[float]:
    """The KiB each push's build hashed for its digest, in order (its load phase's detail)."""
    out = []
    for e in read_events(config):
        detail = str(e.get("detail"))
        if e.get("kind") == "phase_end" and e.get("phase") == "load" and "pushed" in detail:
            amount, unit = detail.split("digest hashed ")[1].split(",")[0].split()
            out.append(float(amount) * (1024 if unit == "MiB" else 1))
    return out


@pytest.mark.parametrize("client_leaves", [False, True], ids=["worker-named", "client-hashed"])
def test_a_push_in_the_standby_hashes_only_its_own_tensors(
    respawned: Respawned, monkeypatch: pytest.MonkeyPatch, client_leaves: bool
) -> None:
    """The block and the pushes the standby maps again come with the digest leaves the
    worker that built them first named (issue 26 item 4 under respawn): a head push over a
    full one hashes the head, not the model. With the leaves the client hashed as it packed
    (protocol/push_leaves.py), no push hashes anything in a worker. The digest is the one
    computed here, from nothing remembered."""
    from hotreload.protocol import push_leaves
    from hotreload.worker.weights_digest import state_digest

    if not client_leaves:  # the client in this process sends none: the workers name them
        monkeypatch.setattr(push_leaves, "MAX_LEAVES_JSON", 0)
    config, _, client, _ = respawned
    hashed = len(hashed_kib(config))
    first = trained(file_state(config), 7)
    client.update_weights("mlp", first)
    wait_until(lambda: status_of(client)["standby"] is not None, 60, what="the next standby")
    head = {k: v * 0.5 for k, v in first.items() if k.startswith("out.")}
    reply = client.update_weights("mlp", head, strict=False)
    assert reply["digest"] == state_digest({**first, **head})
    result = client.infer("mlp", X, min_version=reply["version"])
    assert result.digest == reply["digest"]
    np.testing.assert_allclose(
        result.output, in_process(config, {**first, **head}), rtol=1e-5, atol=1e-6
    )
    model_kib = sum(t.nbytes for t in first.values()) / 1024
    head_kib = sum(t.nbytes for t in head.values()) / 1024
    full, part = hashed_kib(config)[hashed:]
    if client_leaves:
        assert (full, part) == (0, 0), (full, part, model_kib)
    else:
        assert full >= model_kib * 0.9, (full, model_kib)  # every tensor new
        assert part <= head_kib + 1, (part, head_kib, model_kib)  # the block and v2 remembered
    assert all(r["strategy"] == "respawn" for r in push_rows(config))

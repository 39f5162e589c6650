"""A push's digest leaves, hashed by the client as it packs (issue 26 item 3: one pass over
the bytes). The leaves must be the sha256 of each 8 MiB piece of each tensor's bytes as the
memfd holds them, whatever the tensor's layout; the session refuses malformed ones with a
message naming the field; and a version built from a push serves the digest computed here
from nothing remembered, with nothing hashed by the worker."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hotreload import Client
from hotreload.protocol import push_leaves
from hotreload.protocol.push_leaves import LEAF_BYTES, check_leaves
from hotreload.protocol.shared_state import pack_state, validate_descriptor
from tests.support import make_project, read_events
from tests.test_push_weights import X, file_state, in_process, status_of, trained


def _pieces(t: torch.Tensor) -> list[str]:
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return [
        hashlib.sha256(raw[i : i + LEAF_BYTES]).hexdigest() for i in range(0, len(raw), LEAF_BYTES)
    ]


def test_the_leaves_are_the_sha256_of_each_piece_of_each_tensor() -> None:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(5_000_000, generator=g)  # 19 MiB: three leaves, the last one short
    state = {
        "big": big,
        "strided": torch.randn(300, 200, generator=g).t(),  # written from a copy
        "bf16": torch.randn(1000, generator=g).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "array": np.arange(10, dtype=np.int64),
    }
    with pack_state(state) as packed:
        leaves = packed.descriptor["leaves"]
        validate_descriptor(packed.descriptor, peer_pid=os.getpid())
        assert len(leaves["big"]) == 3
        for name, value in state.items():
            t = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            assert leaves[name] == _pieces(t), name
        assert leaves["empty"] == []


def test_a_state_whose_leaves_would_not_fit_the_header_is_packed_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(push_leaves, "MAX_LEAVES_JSON", 100)
    state = {f"t{i}": torch.full((4,), float(i)) for i in range(5)}
    with pack_state(state) as packed:
        assert "leaves" not in packed.descriptor
        validate_descriptor(packed.descriptor)


@pytest.fixture(scope="module")
def descriptor() -> dict:  # type: ignore[type-arg]
    with pack_state({"w": torch.ones(3, 4), "b": torch.zeros(3)}) as packed:
        return copy.deepcopy(packed.descriptor)


@pytest.mark.parametrize(
    ("leaves", "message"),
    [
        (["x"], "must be an object"),
        ({"nope": []}, "'nope', which is no tensor"),
        ({"w": []}, "must be a list of 1 leaves"),
        ({"w": ["ab" * 32, "ab" * 32]}, "must be a list of 1 leaves"),
        ({"w": ["AB" * 32]}, "64 lowercase hex digits"),
        ({"w": [7]}, "64 lowercase hex digits"),
    ],
)
def test_malformed_leaves_are_refused_naming_what_to_fix(
    descriptor: dict,  # type: ignore[type-arg]
    leaves: object,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        check_leaves(leaves, descriptor["tensors"])
    with pytest.raises(ValueError, match=message):
        validate_descriptor({**descriptor, "leaves": leaves})


def hashed_bytes(config: Path) -> list[str]:
    """Each push's load phase detail: what its digest hashed."""
    return [
        str(e.get("detail")).split("digest hashed ")[1].split(",")[0]
        for e in read_events(config)
        if e.get("kind") == "phase_end" and e.get("phase") == "load" and "pushed" in str(e)
    ]


def test_a_push_serves_the_digest_of_its_bytes_with_nothing_hashed_in_the_worker(
    tmp_path: Path, serve
) -> None:  # type: ignore[no-untyped-def]
    from hotreload.worker.weights_digest import state_digest

    config = make_project(tmp_path)
    serve(config)
    with Client(config=config, timeout_s=60) as client:
        state = trained(file_state(config), 3)
        reply = client.update_weights("mlp", state)
        want = state_digest({k: v.clone() for k, v in state.items()})  # nothing remembered
        assert reply["digest"] == want
        result = client.infer("mlp", X, min_version=reply["version"])
        assert (result.version, result.digest) == (reply["version"], want)
        np.testing.assert_allclose(result.output, in_process(config, state), rtol=1e-5, atol=1e-6)
        # A push the model casts (float64 into a float32 model, strict=False) is hashed by the
        # worker: the client's leaves are of bytes that do not serve as they are.
        wide = {k: v.double() for k, v in trained(state, 4).items()}
        reply = client.update_weights("mlp", wide, strict=False)
        assert reply["digest"] == state_digest({k: v.float() for k, v in wide.items()})
        assert status_of(client)["version"] == reply["version"]
    first, cast = hashed_bytes(config)
    assert first == "0 KiB", first
    assert cast != "0 KiB", cast


def test_leaves_that_would_overflow_the_header_are_dropped_not_the_push(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotreload.protocol import weights_ops

    with pack_state({"w": torch.ones(3, 4)}) as packed:
        assert "leaves" in packed.descriptor
        bare = dict(packed.descriptor)
        bare.pop("leaves")
        head = {"op": "update_weights", "model": "m", "strict": True, "state": bare}
        size = len(json.dumps(head, separators=(",", ":")))
        # A limit the push fits under only without its leaves.
        monkeypatch.setattr(weights_ops, "MAX_HEADER_BYTES", size + 1024 + 1)
        header = weights_ops.update_weights_header("m", packed, True, None)
        assert "leaves" not in header["state"]


def test_leaves_count_only_for_bytes_unwritten_since_they_were_mapped() -> None:
    """A worker's mapping of a push is its own copy on write: a load hook that writes a
    tensor in place there changes bytes the client's leaves were hashed from. Such a tensor
    is hashed in the worker; the digest stays the one of what serves."""
    from hotreload.worker.pushed_state import read_state
    from hotreload.worker.shared_weights import as_mapped, remember_over
    from hotreload.worker.weights_digest import state_digest

    g = torch.Generator().manual_seed(5)
    with pack_state({"w": torch.randn(64, 64, generator=g), "b": torch.randn(64)}) as packed:
        leaves = packed.descriptor["leaves"]
        views = read_state(packed.descriptor, torch.device("cpu"))
        as_mapped(views)
        state = {"w": torch.nn.Parameter(views["w"], requires_grad=False), "b": views["b"]}
        with torch.no_grad():
            state["w"].mul_(2)  # through the Parameter: its counter is the view's
        assert remember_over(state, views, leaves) == 1  # "b" only
        want = state_digest({k: v.detach().clone() for k, v in state.items()})
        assert state_digest(state) == want


def test_a_pack_goes_without_leaves_when_it_cannot_map_and_hashes_inline_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No mapping (out of descriptors): the push is packed, without leaves. A push from an
    atexit handler (no new threads then): its big pieces are hashed on the writer's thread."""
    import subprocess
    import sys

    def refuse(fd: int, size: int) -> None:
        raise OSError(24, "Too many open files")

    state = {"w": torch.ones(600_000)}  # 2.3 MiB: a piece the pool would hash
    monkeypatch.setattr(push_leaves, "_map_read_only", refuse)
    with pack_state(state) as packed:
        assert "leaves" not in packed.descriptor
        validate_descriptor(packed.descriptor)
    script = (
        "import atexit, json, torch\n"
        "from hotreload.protocol.shared_state import pack_state\n"
        "def last():\n"
        "    with pack_state({'w': torch.ones(600_000)}) as p:\n"
        "        print(json.dumps(p.descriptor['leaves']))\n"
        "atexit.register(last)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout) == {"w": _pieces(torch.ones(600_000))}, out.stderr

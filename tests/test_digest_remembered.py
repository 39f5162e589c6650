"""A version's digest hashes only the tensors that are new to it (worker/weights_digest.py).

The digest is computed afresh by a reference implementation of the documented format in
each case (no cache), so a remembered leaf that is stale fails the comparison.
"""

from __future__ import annotations

import hashlib
import json
import struct

import torch

from hotreload.worker.weights_digest import CHUNK_BYTES, PREFIX, REMEMBERED, state_digest


def reference_digest(state: dict[str, torch.Tensor]) -> str:
    """The format of the module doc, written out again with no cache and no threads."""
    top = hashlib.sha256(PREFIX)
    for name in sorted(state):
        t = state[name]
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        dtype = str(t.dtype).removeprefix("torch.")
        head = json.dumps([name, dtype, list(t.shape), t.nbytes], separators=(",", ":")).encode()
        top.update(struct.pack("<I", len(head)) + head)
        for start in range(0, len(raw), CHUNK_BYTES):
            top.update(hashlib.sha256(raw[start : start + CHUNK_BYTES]).digest())
    return "sha256:" + top.hexdigest()[:32]


def hashed(state: dict[str, torch.Tensor]) -> tuple[str, int]:
    before = REMEMBERED.hashed_bytes
    digest = state_digest(state)
    assert digest == reference_digest(state)
    return digest, REMEMBERED.hashed_bytes - before


def test_a_version_sharing_its_base_hashes_only_the_new_tensors() -> None:
    g = torch.Generator().manual_seed(0)
    base = {f"layer{i}.weight": torch.randn(512, 1024, generator=g) for i in range(8)}  # 16 MiB
    lora = {"lora_A": torch.randn(4, 1024, generator=g), "lora_B": torch.zeros(512, 4)}
    _, first = hashed({**base, **lora})
    assert first == sum(t.nbytes for t in (*base.values(), *lora.values()))
    # The next push: new adapter tensors over the same base tensors (shared, not copied).
    lora2 = {k: v + 1 for k, v in lora.items()}
    digest, second = hashed({**base, **lora2})
    assert second == sum(t.nbytes for t in lora2.values())
    # The same tensors again: nothing hashed, the same digest.
    assert hashed({**base, **lora2}) == (digest, 0)


def test_a_write_in_place_a_new_view_and_a_freed_storage_are_hashed_again() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 256, generator=g)
    hashed({"w": w})
    w.add_(1.0)  # in place: the version counter moves
    _, n = hashed({"w": w})
    assert n == w.nbytes
    # A view of the same storage at another offset is another tensor.
    _, n = hashed({"w": w[1:]})
    assert n == w[1:].nbytes
    # Freed, and a new tensor of the same shape (its memory may be the old one's address).
    address = w.data_ptr()
    del w
    fresh = torch.full((256, 256), 3.0)
    _, n = hashed({"w": fresh})
    assert n == fresh.nbytes, f"reused address: {fresh.data_ptr() == address}"


def test_tied_tensors_and_inference_tensors() -> None:
    emb = torch.randn(100, 32)
    state = {"embed.weight": emb, "head.weight": emb}  # one storage under two names
    _, n = hashed(state)
    assert n == emb.nbytes  # hashed once
    assert hashed(state)[1] == 0
    with torch.inference_mode():
        t = torch.randn(64, 64)
    hashed({"t": t})
    assert hashed({"t": t})[1] == t.nbytes  # no version counter: never remembered


def test_leaves_named_in_one_mapping_are_remembered_in_another_only_when_they_fit() -> None:
    """shared_weights.leaves_over / remember_over: the leaves a worker named for tensors
    over a mapping, remembered for another mapping of the same bytes (here, two views of
    one buffer). Leaves of the wrong count or not hex are ignored, and the tensor hashed."""
    from hotreload.worker.shared_weights import as_mapped, leaves_over, remember_over

    g = torch.Generator().manual_seed(3)
    buffer = torch.randn(2 * 2**20 + 7, generator=g)  # 8 MiB + 28 bytes: two leaves
    first = {"w": buffer.view(-1)}
    hashed(first)
    named = leaves_over(first, {"w": first["w"]})
    assert list(named) == ["w"] and len(named["w"]) == 2

    again = {"w": buffer[:]}  # another tensor object over the same bytes, not remembered yet
    assert remember_over(again, {"w": again["w"]}, named) == 0, "not noted as mapped"
    as_mapped(again)  # as a worker notes what it maps
    REMEMBERED._by_storage.clear()
    assert remember_over(again, {"w": again["w"]}, {"w": named["w"][:1]}) == 0
    assert remember_over(again, {"w": again["w"]}, {"w": ["zz", "zz"]}) == 0
    assert hashed(again)[1] == buffer.nbytes, "not remembered: hashed"
    REMEMBERED._by_storage.clear()
    assert remember_over(again, {"w": again["w"]}, named) == 1
    assert hashed(again)[1] == 0, "remembered from the names: nothing hashed"


def test_a_digest_on_a_thread_keeps_no_state_alive_once_done() -> None:
    """The version's future keeps its callbacks: they must not keep the hashed state (a
    released version's weights) alive."""
    import gc
    import time
    import types
    import weakref

    from hotreload.worker.shared_weights import digest_version
    from hotreload.worker.weight_sources import PlacedWeights

    t = torch.randn(1000)
    gone = weakref.ref(t)
    mv = types.SimpleNamespace(digest=None, digest_future=None, hashed_bytes=None)
    digest_version(mv, {"w": t}, PlacedWeights(), now=False)
    assert mv.digest_future.result(timeout=30) == reference_digest({"w": t})
    del t
    gc.disable()  # only plain reference counting may free it
    try:
        deadline = time.monotonic() + 10  # the hashing thread lets go as it ends
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gone() is None, "the finished digest still holds the state"
    finally:
        gc.enable()
    assert mv.digest == mv.digest_future.result() and mv.hashed_bytes == 4000

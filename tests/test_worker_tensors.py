"""The worker's request tensors: views over the request's bytes, in every wire dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hotreload.protocol.framing import aligned_buffer
from hotreload.protocol.tensors import WIRE_DTYPES, encode_tensors
from hotreload.worker.inputs import request_tensors


@pytest.mark.parametrize("dtype", sorted(set(WIRE_DTYPES) - {"bfloat16"}))
def test_request_tensors_match_what_the_client_sent(dtype: str) -> None:
    x = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    metas, blobs = encode_tensors({"x": x, "empty": np.zeros((0, 2), dtype)})
    payload = memoryview(bytearray(b"".join(bytes(b) for b in blobs)))
    out = request_tensors(metas, payload)  # type: ignore[arg-type]
    assert out["x"].dtype == getattr(torch, dtype) and out["x"].shape == (3, 4)
    assert np.array_equal(out["x"].numpy(), x)
    assert out["empty"].shape == (0, 2)


def test_aligned_writable_bytes_are_shared_and_the_rest_are_copied_aligned() -> None:
    metas, blobs = encode_tensors({"x": np.ones(4, np.float32)})
    writable = aligned_buffer(16)
    writable[:] = bytes(blobs[0])
    t = request_tensors(metas, writable)  # type: ignore[arg-type]
    t["x"][0] = 7.0
    assert np.frombuffer(writable, np.float32)[0] == 7.0  # no copy was made
    read_only = bytes(blobs[0])
    t = request_tensors(metas, read_only)  # type: ignore[arg-type]  (no warning: a copy)
    t["x"][0] = 7.0
    assert np.frombuffer(read_only, np.float32)[0] == 1.0
    assert t["x"].data_ptr() % 64 == 0
    # Writable but 16 bytes past a boundary (element-aligned, not 64-byte aligned): copied.
    off = aligned_buffer(32)[16:]
    off[:] = bytes(blobs[0])
    t = request_tensors(metas, off)  # type: ignore[arg-type]
    assert t["x"].data_ptr() % 64 == 0 and t["x"].tolist() == [1.0] * 4


def test_every_input_starts_on_a_64_byte_boundary_whatever_the_offsets() -> None:
    # A second input follows the first one's bytes: 3 float32 values leave it 12 bytes in.
    metas, blobs = encode_tensors({"a": np.ones(3, np.float32), "b": np.arange(5.0)})
    body = aligned_buffer(sum(len(b) for b in blobs))
    body[:] = b"".join(bytes(b) for b in blobs)
    out = request_tensors(metas, body)  # type: ignore[arg-type]
    assert all(t.data_ptr() % 64 == 0 for t in out.values())
    assert out["b"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_payload_of_the_wrong_length_is_refused() -> None:
    metas, _ = encode_tensors({"x": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="payload length"):
        request_tensors(metas, memoryview(bytearray(8)))  # type: ignore[arg-type]


def test_a_payload_at_an_odd_address_gives_aligned_tensors() -> None:
    # The payload follows a JSON header of any length: its first byte may sit anywhere.
    x = np.arange(6, dtype=np.float64)
    metas, blobs = encode_tensors({"x": x})
    body = bytearray(b"\x00" * 3 + bytes(blobs[0]))
    out = request_tensors(metas, memoryview(body)[3:])  # type: ignore[arg-type]
    assert out["x"].data_ptr() % 64 == 0
    assert out["x"].tolist() == x.tolist()


def test_bfloat16_and_strings_reach_the_model_as_torch_sees_them() -> None:
    bf = torch.tensor([[1.5, -2.25], [0.1, 7.0]], dtype=torch.bfloat16)
    metas, blobs = encode_tensors({"b": bf, "text": ["a prompt", "ünïcode"]})
    payload = memoryview(bytearray(b"".join(bytes(b) for b in blobs)))
    out = request_tensors(metas, payload)  # type: ignore[arg-type]
    assert out["b"].dtype == torch.bfloat16 and torch.equal(out["b"], bf)
    assert out["text"] == ["a prompt", "ünïcode"]

"""Request tensors as the model sees them: torch views over the request's bytes, aligned."""

from __future__ import annotations

import sys
from typing import Any

import torch

from hotreload.protocol.framing import PAYLOAD_ALIGN, aligned_buffer
from hotreload.protocol.tensors import WIRE_DTYPES, decode_tensors
from hotreload.protocol.text import BYTES, as_rows, decode_strings

#: Wire dtype name -> torch dtype (the wire is little-endian, as every host torch runs on).
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in WIRE_DTYPES}


def to_device(value: Any, device: torch.device) -> Any:
    """A tensor on `device`; strings (a list of str) stay as they are."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


def request_tensors(metas: list[dict[str, Any]], payload: memoryview | bytes) -> dict[str, Any]:
    """Tensors over the request's own bytes (no copy) from header entries the router already
    validated against the payload. A copy where the bytes are read-only, and for a tensor
    not on a PAYLOAD_ALIGN boundary (the reader aligns the payload's start, so only a
    second or later input whose offset is not a multiple of 64 bytes): kernels round
    differently for unaligned data, and one input must give one answer. A strings input
    becomes a list of str, one per row."""
    if sys.byteorder != "little":
        arrays = decode_tensors(metas, payload, writable=True)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}
    if any(m["dtype"] == BYTES for m in metas):
        return _with_strings(metas, payload)
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    if view.readonly:
        copy = aligned_buffer(len(view))
        copy[:] = view
        view = copy
    if sum(m["nbytes"] for m in metas) != len(view):
        raise ValueError("payload length does not match the tensors in the header")
    out: dict[str, Any] = {}
    offset = 0
    for m in metas:
        n, dtype = m["nbytes"], TORCH_DTYPES[m["dtype"]]
        if n:
            t = torch.frombuffer(view[offset : offset + n], dtype=dtype).reshape(m["shape"])
            if t.data_ptr() % PAYLOAD_ALIGN:
                t = t.clone()  # torch's CPU allocator aligns to 64 bytes
        else:
            t = torch.empty(m["shape"], dtype=dtype)
        out[m["name"]] = t
        offset += n
    return out


def _with_strings(metas: list[dict[str, Any]], payload: memoryview | bytes) -> dict[str, Any]:
    """A request with a strings input: each part decoded on its own (text is small; the
    tensors beside it still become aligned views)."""
    out: dict[str, Any] = {}
    offset = 0
    for m in metas:
        n = m["nbytes"]
        part = payload[offset : offset + n]
        if m["dtype"] == BYTES:
            out[m["name"]] = as_rows(decode_strings(part, m["shape"], m["name"]))
        else:
            out.update(request_tensors([m], part))
        offset += n
    return out


def replay_inputs(
    example: dict[str, Any], metas: list[dict[str, Any]], device: torch.device
) -> dict[str, Any]:
    """Inputs shaped as a served request was (`metas`: name, dtype, shape, named as the
    example's inputs), filled with the example's own values repeated: token ids stay in
    the vocabulary and activations in range, and no random values change an answer's path.
    Dynamo's guards look at shapes and dtypes, so these compile what that request did."""
    out: dict[str, Any] = {}
    for m in metas:
        shape, dtype = list(m["shape"]), TORCH_DTYPES[m["dtype"]]
        seed = example.get(m["name"])
        n = 1
        for s in shape:
            n *= int(s)
        if isinstance(seed, torch.Tensor) and seed.numel() and n:
            flat = seed.detach().reshape(-1).to(device=device, dtype=dtype)
            reps = -(-n // flat.numel())
            out[m["name"]] = flat.repeat(reps)[:n].reshape(shape).contiguous()
        else:
            out[m["name"]] = torch.zeros(shape, dtype=dtype, device=device)
    return out

"""Request tensors as the model sees them: torch views over the request's bytes, aligned."""

from __future__ import annotations

import sys
from typing import Any

import torch

from hotreload.protocol.framing import PAYLOAD_ALIGN, aligned_buffer
from hotreload.protocol.tensors import WIRE_DTYPES, decode_tensors

#: Wire dtype name -> torch dtype (the wire is little-endian, as every host torch runs on).
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in WIRE_DTYPES}


def request_tensors(
    metas: list[dict[str, Any]], payload: memoryview | bytes
) -> dict[str, torch.Tensor]:
    """Tensors over the request's own bytes (no copy) from header entries the router already
    validated against the payload. A copy where the bytes are read-only, and for a tensor
    not on a PAYLOAD_ALIGN boundary (the reader aligns the payload's start, so only a
    second or later input whose offset is not a multiple of 64 bytes): kernels round
    differently for unaligned data, and one input must give one answer."""
    if sys.byteorder != "little":
        arrays = decode_tensors(metas, payload, writable=True)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    if view.readonly:
        copy = aligned_buffer(len(view))
        copy[:] = view
        view = copy
    if sum(m["nbytes"] for m in metas) != len(view):
        raise ValueError("payload length does not match the tensors in the header")
    out: dict[str, torch.Tensor] = {}
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

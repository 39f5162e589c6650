"""Tensors on the wire: dtype name, shape and raw little-endian bytes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from hotreload.errors import ProtocolError

#: dtype names that may travel. bfloat16 is absent on purpose: numpy cannot hold it, so a
#: client could not read it; the worker reports such outputs as an error to fix.
WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "float32",
        "float64",
    )
}
MAX_RANK = 32


class TensorMeta(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    nbytes: int


def as_array(value: Any) -> np.ndarray:
    """numpy view of a numpy array, a torch tensor (duck-typed: no torch import) or a list."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def encode_tensors(named: Mapping[str, Any]) -> tuple[list[TensorMeta], list[bytes | memoryview]]:
    """Header entries and byte blobs for named tensors (numpy arrays or torch tensors)."""
    metas: list[TensorMeta] = []
    blobs: list[bytes | memoryview] = []
    for name, value in named.items():
        arr = as_array(value)
        dtype_name = arr.dtype.name
        if dtype_name not in WIRE_DTYPES:
            raise ProtocolError(
                f"tensor {name!r} has dtype {dtype_name}, which cannot travel; "
                f"use one of {', '.join(WIRE_DTYPES)}"
            )
        arr = np.ascontiguousarray(arr, dtype=WIRE_DTYPES[dtype_name])
        data = memoryview(arr).cast("B") if arr.nbytes else b""
        metas.append(
            {"name": name, "dtype": dtype_name, "shape": list(arr.shape), "nbytes": arr.nbytes}
        )
        blobs.append(data)
    return metas, blobs


def validate_metas(metas: Any, payload_len: int) -> list[TensorMeta]:
    """Check header tensor entries against the payload; raises ProtocolError saying what is off."""
    if not isinstance(metas, list):
        raise ProtocolError("'tensors' must be a list of {name, dtype, shape, nbytes}")
    total = 0
    names: set[str] = set()
    for i, meta in enumerate(metas):
        if not isinstance(meta, dict):
            raise ProtocolError(f"tensors[{i}] must be an object")
        name, dtype, shape, nbytes = (meta.get(k) for k in ("name", "dtype", "shape", "nbytes"))
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"tensors[{i}].name must be a non-empty string")
        if name in names:
            raise ProtocolError(f"tensor name {name!r} appears twice")
        names.add(name)
        if not isinstance(dtype, str) or dtype not in WIRE_DTYPES:
            raise ProtocolError(
                f"tensor {name!r}: unsupported dtype {dtype!r}; use one of {', '.join(WIRE_DTYPES)}"
            )
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError(
                f"tensor {name!r}: shape must be a list of sizes >= 0, got {shape!r}"
            )
        expected = math.prod(shape) * WIRE_DTYPES[dtype].itemsize
        if nbytes != expected:
            raise ProtocolError(
                f"tensor {name!r}: nbytes {nbytes!r} does not match dtype {dtype} and shape "
                f"{shape} ({expected} bytes)"
            )
        total += expected
    if total != payload_len:
        raise ProtocolError(
            f"payload has {payload_len} bytes but the tensors declare {total} bytes"
        )
    return metas


def decode_tensors(
    metas: Sequence[TensorMeta], payload: bytes | memoryview, *, writable: bool = False
) -> dict[str, np.ndarray]:
    """numpy arrays from a validated header and payload (views unless `writable`)."""
    validate_metas(metas, len(payload))
    out: dict[str, np.ndarray] = {}
    offset = 0
    for meta in metas:
        n = meta["nbytes"]
        arr = np.frombuffer(payload[offset : offset + n], dtype=WIRE_DTYPES[meta["dtype"]])
        arr = arr.reshape(meta["shape"])
        out[meta["name"]] = arr.copy() if writable else arr
        offset += n
    return out

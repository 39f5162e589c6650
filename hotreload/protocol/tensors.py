"""Tensors on the wire: dtype name, shape and raw little-endian bytes."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from hotreload.errors import ProtocolError
from hotreload.protocol.text import BYTES, decode_strings, encode_strings, is_text, split_strings

#: Fixed-size dtype names that may travel, and the numpy dtype that holds their bytes.
#: numpy has no bfloat16: its 2-byte pattern travels as is, held as uint16 (clients widen it
#: to float32 unless asked for the raw bits). Strings travel as BYTES (`protocol/text.py`).
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
#: numpy dtype -> its name, for the fixed-size ones in native byte order: `dtype.name` is a
#: property written in Python that took 2 us of the 5 an answer's tensor costs to encode.
_DTYPE_NAMES: dict[np.dtype[Any], str] = {np.dtype(name): name for name in WIRE_DTYPES}
BF16 = "bfloat16"
WIRE_DTYPES[BF16] = np.dtype("<u2")
#: Every dtype name a tensor on the wire may carry.
ALL_WIRE_DTYPES = (*WIRE_DTYPES, BYTES)
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


def _is_bf16_tensor(value: Any) -> bool:
    return str(getattr(value, "dtype", "")) == "torch.bfloat16" and hasattr(value, "view")


def encode_tensors(named: Mapping[str, Any]) -> tuple[list[TensorMeta], list[bytes | memoryview]]:
    """Header entries and byte blobs for named tensors (numpy arrays or torch tensors)."""
    metas: list[TensorMeta] = []
    blobs: list[bytes | memoryview] = []
    for name, value in named.items():
        if is_text(value):
            shape, data = encode_strings(value)
            metas.append({"name": name, "dtype": BYTES, "shape": shape, "nbytes": len(data)})
            blobs.append(data)
            continue
        if _is_bf16_tensor(value):
            # Its bit pattern, reinterpreted (no rounding): int16 is what numpy can hold.
            arr = value.detach().contiguous().view(_int16_of(value)).cpu().numpy()
            dtype_name = BF16
        else:
            arr = as_array(value)
            dtype_name = _DTYPE_NAMES.get(arr.dtype) or arr.dtype.name
        if dtype_name not in WIRE_DTYPES:
            raise ProtocolError(
                f"tensor {name!r} has dtype {dtype_name}, which cannot travel; "
                f"use one of {', '.join(ALL_WIRE_DTYPES)}"
            )
        if dtype_name == BF16:  # torch's or ml_dtypes' bfloat16: its bits, as uint16
            arr = np.ascontiguousarray(arr).view(WIRE_DTYPES[BF16])
        else:
            arr = np.ascontiguousarray(arr, dtype=WIRE_DTYPES[dtype_name])
        data = memoryview(arr).cast("B") if arr.nbytes else b""
        metas.append(
            {"name": name, "dtype": dtype_name, "shape": list(arr.shape), "nbytes": arr.nbytes}
        )
        blobs.append(data)
    return metas, blobs


def validate_metas(
    metas: Any, payload_len: int, payload: bytes | memoryview | None = None
) -> list[TensorMeta]:
    """Check header tensor entries against the payload; raises ProtocolError saying what is off.
    With `payload`, a strings tensor's element lengths are checked too."""
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
        if not isinstance(dtype, str) or dtype not in ALL_WIRE_DTYPES:
            raise ProtocolError(
                f"tensor {name!r}: unsupported dtype {dtype!r}; use one of "
                f"{', '.join(ALL_WIRE_DTYPES)}"
            )
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError(
                f"tensor {name!r}: shape must be a list of sizes >= 0, got {shape!r}"
            )
        if dtype == BYTES:
            count = math.prod(shape)
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 4 * count:
                raise ProtocolError(
                    f"tensor {name!r}: nbytes {nbytes!r} is too small for {count} BYTES "
                    "element(s) (4 bytes of length each, at least)"
                )
            if payload is not None and total + nbytes <= payload_len:
                split_strings(payload[total : total + nbytes], count, f"tensor {name!r}")
            total += nbytes
            continue
        expected = math.prod(shape) * WIRE_DTYPES[dtype].itemsize
        # An integer, not merely equal: 256.0 == 256, and a float reached the worker.
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes != expected:
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
        if meta["dtype"] == BYTES:
            out[meta["name"]] = decode_strings(payload[offset : offset + n], meta["shape"])
            offset += n
            continue
        arr = np.frombuffer(payload[offset : offset + n], dtype=WIRE_DTYPES[meta["dtype"]])
        arr = arr.reshape(meta["shape"])
        out[meta["name"]] = arr.copy() if writable else arr
        offset += n
    return out


def _int16_of(tensor: Any) -> Any:
    """torch.int16 from a tensor's own module (this module never imports torch)."""
    return sys.modules[type(tensor).__module__.split(".")[0]].int16


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32: exact, bfloat16 is float32's top half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    nan = np.isnan(values)
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    out[nan] = 0x7FC0
    return out

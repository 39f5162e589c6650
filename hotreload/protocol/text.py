"""Strings on the wire, laid out as KServe's BYTES tensors: each element is a 4-byte
little-endian length followed by that many bytes, elements in row-major order.

No pickle: a client's bytes are only ever lengths and UTF-8 text. The same layout is what
tritonclient sends and expects in the binary tensor extension, so HTTP passes it through.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from hotreload.errors import ProtocolError

#: The wire dtype name of a strings tensor (KServe's BYTES).
BYTES = "bytes"
_LEN = struct.Struct("<I")


def is_text(value: Any) -> bool:
    """A str/bytes, a non-empty list or tuple of them, or a numpy array of strings."""
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, (str, bytes)) for v in value)
    return isinstance(value, np.ndarray) and value.dtype.kind in "USO"


def encode_strings(value: Any) -> tuple[list[int], bytes]:
    """The shape and BYTES layout of a str, a list of str, or an array of strings."""
    arr = np.asarray(value, dtype=object)
    parts: list[bytes] = []
    for item in arr.reshape(-1).tolist():
        if isinstance(item, str):
            data = item.encode()
        elif isinstance(item, (bytes, bytearray)):
            data = bytes(item)
        else:
            raise ProtocolError(
                f"a strings tensor holds a {type(item).__name__}; every element must be str"
            )
        parts += (_LEN.pack(len(data)), data)
    return list(arr.shape), b"".join(parts)


def split_strings(blob: bytes | memoryview, count: int, name: str = "tensor") -> list[bytes]:
    """The `count` elements of a BYTES layout; ProtocolError when it does not add up."""
    view = memoryview(blob).cast("B") if not isinstance(blob, bytes) else blob
    out: list[bytes] = []
    pos, end = 0, len(view)
    for i in range(count):
        if pos + 4 > end:
            raise ProtocolError(
                f"{name}: BYTES element {i} of {count} has no 4-byte length ({end - pos} left)"
            )
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise ProtocolError(
                f"{name}: BYTES element {i} declares {n} bytes but {end - pos} remain"
            )
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != end:
        raise ProtocolError(
            f"{name}: {end - pos} byte(s) follow the last of {count} BYTES elements"
        )
    return out


def decode_strings(blob: bytes | memoryview, shape: list[int], name: str = "tensor") -> Any:
    """A numpy object array of `shape` holding str (bytes where not valid UTF-8)."""
    items: list[Any] = []
    for data in split_strings(blob, math.prod(shape), name):
        try:
            items.append(data.decode())
        except UnicodeDecodeError:
            items.append(data)
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape)


def as_rows(arr: Any) -> Any:
    """What a model receives for a strings input: a list with one str per row ([N] or
    [N, 1]), nested lists for other shapes, a str for a scalar."""
    if arr.ndim == 2 and arr.shape[1] == 1:
        return arr[:, 0].tolist()
    return arr.tolist()

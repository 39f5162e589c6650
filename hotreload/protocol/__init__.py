"""Wire protocol: length-prefixed frames carrying a JSON header and raw tensor bytes.

Standard library and numpy only; no pickle on any socket, so a client can never make the
server execute code by sending a crafted frame.
"""

from hotreload.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    pack_frame,
    read_frame,
    read_frame_sync,
    unpack_body,
)
from hotreload.protocol.tensors import WIRE_DTYPES, TensorMeta, decode_tensors, encode_tensors

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "WIRE_DTYPES",
    "Frame",
    "TensorMeta",
    "decode_tensors",
    "encode_tensors",
    "pack_frame",
    "read_frame",
    "read_frame_sync",
    "unpack_body",
]

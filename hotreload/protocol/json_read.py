"""`loads`: `json.loads`, through orjson where it is installed (the `fast` extra).

The request path reads JSON at every hop: a KServe body (a 1x64 FP32 `data` list took the
stdlib 13 us, orjson 1.5 us) and a frame header in each process. orjson is optional; the
answer is always the one `json.loads` gives, value for value:

- whatever orjson refuses goes to `json.loads`, which answers it (its value: NaN,
  Infinity, 1e400, a lone surrogate, a BOM, UTF-16; or its own error, so messages are the
  stdlib's);
- a text with a run of 19 or more digits goes to `json.loads` unread by orjson, which
  turns an integer past 64 bits into a float where the stdlib keeps the int (19 digits:
  the shortest past int64 once negative). A long fraction goes there too: same value,
  the slower way.
"""

from __future__ import annotations

import importlib
import json
from typing import Any


def _optional_module(name: str) -> Any:
    """The module `name`, or None where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


#: orjson, or None (the stdlib alone: the same values, slower). An assignment, not an import
#: in a try: `hotreload export` copies the functions exported models call, with the top-level
#: definitions and imports they use, out of this source (export/bundle.py).
orjson: Any = _optional_module("orjson")

#: Every digit to "0", every other byte to " ": a run of digits that orjson may not read
#: as the stdlib does (see the module's doc) is then a plain substring, found in a fraction
#: of the time a regular expression takes (0.4 us for a 1x64 body, against 1.9 us).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = b"0" * 19


def loads(data: bytes | bytearray | memoryview) -> Any:
    """`json.loads(bytes(data))`: the same value, or the same exception."""
    text = data if isinstance(data, bytes) else bytes(data)
    if orjson is not None and _LONG_RUN not in text.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # the stdlib says what it is: a value orjson refuses, or the error
    return json.loads(text)

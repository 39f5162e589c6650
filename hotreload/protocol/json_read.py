"""`loads`: `json.loads`, through orjson where it is installed (the `fast` extra); and
`dumps`, compact JSON that reads back as the stdlib's writing does.

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
import math
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


#: `json.dumps(value, separators=(",", ":"))`, made once: dumps builds an encoder on every
#: call that is given a separator, a quarter of the time a small header takes.
compact_json = json.JSONEncoder(separators=(",", ":")).encode
#: Types orjson would write where the stdlib refuses them, or writes their own way: handed
#: back to it, so it raises and the stdlib says what it says.
_ORJSON_STRICT = (
    0
    if orjson is None
    else orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def dumps(value: Any) -> bytes:
    """Compact JSON of `value` that `json.loads` reads back as it reads the stdlib's
    (`json.dumps(value, separators=(",", ":")).encode()`), for the JSON types (dicts,
    lists, strings, numbers, bools, None) the wire carries; other types are not asked for
    (orjson writes a UUID or an Enum's value where the stdlib raises).

    Through orjson where it is installed: a KServe answer of ten float32 outputs took the
    stdlib 107,000 instructions (Python writes each float's 17 digits through big-number
    arithmetic), orjson 9,000. The text may differ where the value does not:
    non-ASCII characters as UTF-8 rather than escaped, exponents as `1e-7` rather than
    `1e-07`. orjson writes NaN and the infinities as null, where the stdlib writes NaN and
    Infinity: a value holding one is written by the stdlib (as is whatever orjson refuses:
    an integer past 64 bits, a key that is no string, a subclass). Which writer writes a
    value depends on nothing else, so `framing.header_bytes` measures a header as it is
    sent, None or not.
    """
    if orjson is not None:
        try:
            text: bytes = orjson.dumps(value, option=_ORJSON_STRICT)
        except TypeError:  # orjson.JSONEncodeError
            pass
        else:
            # A text without `null` holds no NaN; one with it is looked through (rare).
            if b"null" not in text or not _non_finite(value):
                return text
    return compact_json(value).encode()


def _non_finite(value: Any) -> bool:
    """Does `value` (which orjson wrote: at most 255 levels deep) hold a NaN or an
    infinity?"""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False

"""The type of every header field a client may send on the session socket, checked at the
edge before any handler looks at a value.

A JSON header can carry any value in any field: a list where an op name belongs would reach
a dict lookup (`TypeError: unhashable type`) deep inside a handler and come back as an
internal error, or, in the frame callback, stop the connection without a reply. One table
checked once keeps every handler able to trust the types it reads.
"""

from __future__ import annotations

import math
from typing import Any

#: field -> (accepted Python types after json.loads, what to say is expected).
#: `bool` is never an int here (json `true` would otherwise pass as GPU index 1).
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "op": ((str,), "an op name (a string)"),
    "id": ((int, str, type(None)), "an integer, a string or null"),
    "model": ((str, type(None)), "a model name (a string) or null"),
    "trigger": ((str, type(None)), "a string or null"),
    "timeout_s": ((int, float, type(None)), "a finite number of seconds or null"),
    "form": ((str, type(None)), "'single', 'tuple', 'dict' or null"),
    "tensors": ((list,), "a list of {name, dtype, shape, nbytes} objects"),
    "replay": ((int,), "a number of events (an integer)"),
    "paused": ((bool,), "true or false"),
    "index": ((int,), "a GPU index (an integer >= 0)"),
    "parameters": ((dict, type(None)), "an object of name -> value, or null"),
    "min_version": ((int, type(None)), "a version number (an integer) or null"),
    "version": ((int,), "a version number (an integer)"),
    "strict": ((bool,), "true or false"),
    "state": ((dict,), "a shared-memory state descriptor (an object)"),
    "base_digest": ((str, type(None)), "a weights digest (a string) or null"),
}


def json_type(value: Any) -> str:
    """The JSON name of a value's type (a client wrote JSON, not Python)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float) and not math.isfinite(value):
        return False  # NaN or Infinity (json.loads accepts both): no deadline to compute
    return isinstance(value, types)


def header_problem(header: dict[str, Any]) -> str | None:
    """None when every known field has its type, else a message naming the field, what it
    holds and what it must be. Unknown fields are left alone (newer clients may add some)."""
    if "op" not in header:
        return "the frame header has no 'op'; it must be an op name (a string)"
    for name, (types, expected) in FIELD_TYPES.items():
        if name in header and not _fits(header[name], types):
            return f"header field {name!r} must be {expected}, got {json_type(header[name])}"
    return None


def reply_id(header: dict[str, Any]) -> int | str | None:
    """The id to answer with: the request's own when it is a valid one, else null."""
    rid = header.get("id")
    return rid if _fits(rid, FIELD_TYPES["id"][0]) else None

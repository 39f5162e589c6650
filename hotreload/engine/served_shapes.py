"""The input signatures a model served recently, so a new version is warmed at each of them.

A compiled model compiles again at a shape its new version has not seen (and a CUDA model
autotunes and grows its allocator there): that cost lands on the first request at that
shape unless the build's warm phase ran it first. The router notes each admitted request's
shapes and dtypes here; the warm phase (engine/model/phases.py) replays the distinct ones
noted in the last `max_age_s`, at most `limit` of them, newest first. The log belongs to
the model's router, in the session's memory: it outlives versions, worker restarts and
respawns, never the session (a new `hotreload serve` starts with none).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hotreload.engine.signature import check_inputs
from hotreload.protocol.text import BYTES

#: One signature as the log keys it: (name, dtype, shape) per input, in request order.
Key = tuple[tuple[str, str, tuple[int, ...]], ...]

#: Distinct signatures kept, and for how long one not seen again is kept.
DEFAULT_LIMIT = 16
DEFAULT_MAX_AGE_S = 600.0
#: The share of `deadlines.warm_s` the warm phase may spend before the rest of the served
#: signatures is left out: their compiles then happen on requests, but the build succeeds.
REPLAY_SHARE = 0.8
#: How stale a repeated signature's "last seen" may get: against a 600 s age, a second
#: changes nothing, and the router pays no dict update per request.
REFRESH_S = 1.0


@dataclass
class ServedShapes:
    limit: int = DEFAULT_LIMIT
    max_age_s: float = DEFAULT_MAX_AGE_S
    clock: Callable[[], float] = time.monotonic
    #: Key -> when it was last seen (to `REFRESH_S`); least recently seen first.
    _seen: OrderedDict[Key, float] = field(default_factory=OrderedDict)
    #: The last signature noted, as (name, dtype, shape list) per input, its key, and when
    #: its entry was last written: a request like the one before it (the common case)
    #: costs a comparison and a clock read, not a key, a hash and a dict update.
    _last: list[tuple[Any, Any, Any]] | None = None
    _last_key: Key | None = None
    _last_at: float = 0.0

    def __post_init__(self) -> None:
        if self.limit < 0 or self.max_age_s < 0:
            raise ValueError(
                f"served shapes: limit ({self.limit}) and max_age_s ({self.max_age_s}) must "
                "be 0 or more (0 keeps none)"
            )

    def note(self, metas: Sequence[dict[str, Any]]) -> None:
        """One admitted request's tensors (the router's checked `metas`). Requests with no
        tensors (text) and strings inputs are not replayable, so not kept."""
        if not metas or not self.limit:
            return
        last = self._last
        if last is not None and len(metas) == len(last):
            for m, (name, dtype, shape) in zip(metas, last):  # noqa: B905 (lengths equal)
                if m.get("shape") != shape or m.get("dtype") != dtype or m.get("name") != name:
                    break
            else:  # the signature of the request before: its entry is fresh to a second
                now = self.clock()
                if now - self._last_at >= REFRESH_S:
                    self._write(self._last_key, now)  # type: ignore[arg-type]
                return
        try:
            key: Key = tuple((m["name"], m["dtype"], tuple(m["shape"])) for m in metas)
        except (KeyError, TypeError):
            return  # checked by the router before this: nothing to replay
        if any(dtype == BYTES for _, dtype, _ in key):
            return
        self._last = [(m["name"], m["dtype"], list(m["shape"])) for m in metas]
        self._last_key = key
        self._write(key, self.clock())

    def _write(self, key: Key, now: float) -> None:
        seen = self._seen
        if key in seen:
            seen.move_to_end(key)
        seen[key] = now
        self._last_at = now
        while len(seen) > self.limit:
            seen.popitem(last=False)

    def recent(self) -> list[list[dict[str, Any]]]:
        """The signatures seen within `max_age_s`, newest first, as request metas
        (name, dtype, shape); older ones are forgotten."""
        cutoff = self.clock() - self.max_age_s
        for key in [k for k, at in self._seen.items() if at < cutoff]:
            del self._seen[key]
        return [
            [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in key]
            for key in reversed(self._seen)
        ]

    def __len__(self) -> int:
        return len(self._seen)


def replayable(
    logged: Sequence[list[dict[str, Any]]],
    input_form: str,
    inputs: list[dict[str, Any]],
) -> list[list[dict[str, Any]]]:
    """The logged signatures a version with `inputs` accepts, its example's own left out
    (the warm-up's passes run that): a reload that changed the inputs replays none of the
    old ones it would refuse."""
    example = [(e["dtype"], list(e["shape"])) for e in inputs]
    out = []
    for metas in logged:
        if check_inputs(None, metas, input_form, inputs) is not None:
            continue
        if input_form == "single":
            ordered = metas
        else:
            by_name = {m["name"]: m for m in metas}
            ordered = [by_name[e["name"]] for e in inputs]
        if [(m["dtype"], list(m["shape"])) for m in ordered] == example:
            continue
        out.append([{**m, "name": e["name"]} for m, e in zip(ordered, inputs, strict=True)])
    return out

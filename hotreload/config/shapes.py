"""The `shapes` table of a model: which input dimensions may vary, Triton-style.

    shapes = { input_ids = [-1, -1], attention_mask = [-1, -1] }

`-1` is any size. A single-input model's input is called `input`. An input left out keeps
the default: dimension 0 (the batch) varies, the others are the example's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hotreload.protocol.tensors import MAX_RANK


def parse_shapes(
    table: Mapping[str, Any], key: str, fail: Callable[[str, str], None]
) -> dict[str, tuple[int, ...]]:
    """Validated `shapes`; `fail(key, message)` raises the config error."""
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in table.items():
        where = f"{key}.{name}"
        if (
            not isinstance(dims, list)
            or len(dims) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in dims)
        ):
            fail(where, f"expected a list of sizes, -1 for any size (e.g. [-1, -1]), got {dims!r}")
        if 0 in dims:
            fail(where, f"a dimension of 0 accepts only empty tensors; use -1 for any size: {dims}")
        out[str(name)] = tuple(dims)
    return out

"""Check a request's tensors against the model's input signature before it is queued.

The signature comes from the example input: same names, dtypes and rank; every dimension
but the first (the batch) must match. A wrong request is answered at once, and the worker
never sees it.
"""

from __future__ import annotations

from typing import Any


def _fmt(shape: list[int]) -> str:
    return "[" + ", ".join(["N", *(str(d) for d in shape[1:])]) + "]" if shape else "[]"


def check_inputs(
    form: str | None,
    metas: list[dict[str, Any]],
    expected_form: str,
    expected: list[dict[str, Any]],
) -> str | None:
    """None when the request fits, else a message saying what is wrong and what was expected."""
    if not expected:
        return None
    want = {e["name"]: e for e in expected}
    if expected_form == "single":
        if len(metas) != 1:
            return f"expected one input tensor, got {len(metas)}"
        pairs = [(metas[0], expected[0])]
    else:
        got_names = [m["name"] for m in metas]
        if sorted(got_names) != sorted(want):
            return f"expected inputs named {sorted(want)}, got {got_names}"
        pairs = [(m, want[m["name"]]) for m in metas]
    for meta, exp in pairs:
        label = exp["name"] if expected_form != "single" else "input"
        if meta["dtype"] != exp["dtype"]:
            return f"{label}: expected dtype {exp['dtype']}, got {meta['dtype']}"
        shape, want_shape = meta["shape"], exp["shape"]
        if len(shape) != len(want_shape) or (len(shape) > 1 and shape[1:] != want_shape[1:]):
            return f"{label}: expected shape {_fmt(want_shape)} (dimension 0 may vary), got {shape}"
    return None

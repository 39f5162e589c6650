"""Check a request's tensors against the model's input signature before it is queued.

The signature comes from the example input: names, dtypes and rank. Each entry's `dims`
say which sizes may vary, Triton-style (-1 = any size): dimension 0 (the batch) unless the
model's `shapes` declares more. A wrong request is answered at once, and the worker never
sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hotreload.protocol.tensors import BF16, WIRE_DTYPES
from hotreload.protocol.text import BYTES

#: Parameter values a request may carry (JSON scalars, and lists of them).
_SCALARS = (str, int, float, bool, type(None))


def dims_of(entry: Mapping[str, Any]) -> list[int]:
    """The declared dimensions of a signature entry: -1 where any size is accepted."""
    dims = entry.get("dims")
    if dims is not None:
        return list(dims)
    shape = list(entry["shape"])
    return [-1, *shape[1:]] if shape else []


def output_dims(inputs: Sequence[Mapping[str, Any]], output: Mapping[str, Any]) -> list[int]:
    """An output's dimensions, -1 where they may vary: dimension 0, and the others too as
    soon as an input may vary beyond its batch (a sequence length may reach the outputs).
    KServe metadata and the Triton export both say this."""
    shape = list(output["shape"])
    if any(-1 in dims_of(e)[1:] for e in inputs):
        return [-1] * len(shape)
    return [-1, *shape[1:]] if shape else []


def format_dims(dims: Sequence[int]) -> str:
    """`[N, 64]` when only the batch varies (the common case), else Triton's `[-1, -1, 64]`."""
    if dims and dims[0] == -1 and all(d != -1 for d in dims[1:]):
        return "[" + ", ".join(["N", *(str(d) for d in dims[1:])]) + "]"
    return "[" + ", ".join(str(d) for d in dims) + "]"


def inputs_change(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> str | None:
    """`input [N,3,32,32] → [N,3,64,64]` when a reload changed what requests must send (the
    example's shape or dtype, or the inputs' names), so clients that fail afterwards are no
    surprise; None when requests that fitted before still fit the same way."""

    def compact(e: Mapping[str, Any]) -> str:
        return format_dims(dims_of(e)).replace(", ", ",")

    before = {e["name"]: e for e in old}
    after = {e["name"]: e for e in new}
    parts: list[str] = []
    for name, e in after.items():
        was = before.get(name)
        if was is None:
            parts.append(f"{name} added ({e['dtype']}{compact(e)})")
        elif (was["dtype"], compact(was)) != (e["dtype"], compact(e)):
            same = was["dtype"] == e["dtype"]
            old_dt, new_dt = ("", "") if same else (was["dtype"], e["dtype"])
            parts.append(f"{name} {old_dt}{compact(was)} → {new_dt}{compact(e)}")
    parts += [f"{name} removed" for name in before if name not in after]
    return ", ".join(parts) or None


def _varies(dims: Sequence[int]) -> str:
    free = [str(i) for i, d in enumerate(dims) if d == -1]
    if not free:
        return "no dimension may vary"
    return f"dimension{'s' if len(free) > 1 else ''} {', '.join(free)} may vary"


def shape_problem(label: str, shape: Sequence[int], dims: Sequence[int], text: bool) -> str | None:
    """None when `shape` fits `dims`; else a message naming the dimension. Strings get no
    extra dimension: [N, 1] for a [-1] input is refused, as Triton refuses it for the
    exported model (its dims are hotreload's) and as the model metadata says."""
    if len(shape) != len(dims):
        hint = ""
        if text and len(shape) == len(dims) + 1 and shape[-1] == 1:
            flat = format_dims(dims) if dims else "[] (one string)"
            hint = f"; send the strings with shape {flat}, without the trailing 1"
        return (
            f"{label}: expected shape {format_dims(dims)} ({_varies(dims)}), got "
            f"{list(shape)}: {len(shape)} dimension(s) instead of {len(dims)}{hint}"
        )
    for i, (got, want) in enumerate(zip(shape, dims, strict=True)):
        if want != -1 and got != want:
            return (
                f"{label}: expected shape {format_dims(dims)} ({_varies(dims)}), got "
                f"{list(shape)}: dimension {i} is {got}, not {want} (to accept any size "
                f"there, declare it -1 in the model's `shapes`)"
            )
    return None


def _takes(expected: Sequence[Mapping[str, Any]]) -> str:
    """`input_ids (int64 [-1, -1]), attention_mask (int64 [-1, -1])`: what to send."""
    return ", ".join(f"{e['name']} ({e['dtype']} {format_dims(dims_of(e))})" for e in expected)


def _names_problem(got: list[str], want: list[str]) -> str:
    unknown = [n for n in got if n not in want]
    missing = [n for n in want if n not in got]
    parts = [f"the model has no input named {', '.join(map(repr, unknown))}"] if unknown else []
    parts += [f"input {', '.join(map(repr, missing))} is missing"] if missing else []
    if not parts:  # the same names, one of them twice
        parts = [f"inputs {got} name one input more than once"]
    return "; ".join(parts)


def _convert(expected: Mapping[str, Any]) -> str:
    """How to send the dtype the model takes (numpy has no bfloat16: torch's way only)."""
    want = expected["dtype"]
    torch_way = f".to(torch.{want})"
    if want == BF16:
        return f"; convert it with {torch_way} before sending"
    numpy = "bool_" if want == "bool" else want  # np.bool is numpy 2 only
    return f"; convert it with .astype(np.{numpy}) before sending (a torch tensor: {torch_way})"


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
            return f"expected one input tensor, got {len(metas)}; it takes {_takes(expected)}"
        pairs = [(metas[0], expected[0])]
    else:
        got_names = [m["name"] for m in metas]
        if sorted(got_names) != sorted(want):
            return f"{_names_problem(got_names, list(want))}; the model takes {_takes(expected)}"
        pairs = [(m, want[m["name"]]) for m in metas]
    for meta, exp in pairs:
        label = exp["name"] if expected_form != "single" else "input"
        if meta["dtype"] != exp["dtype"]:
            if exp["dtype"] == "bytes":
                return f"{label}: expected strings (BYTES), got dtype {meta['dtype']}"
            return f"{label}: expected dtype {exp['dtype']}, got {meta['dtype']}{_convert(exp)}"
        problem = shape_problem(label, meta["shape"], dims_of(exp), exp["dtype"] == "bytes")
        if problem:
            return problem
    return None


def check_parameters(parameters: Any) -> str | None:
    """None for a valid per-request `parameters` object (names -> JSON scalars or lists)."""
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        return f"'parameters' must be an object of name -> value, got {type(parameters).__name__}"
    for key, value in parameters.items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, _SCALARS) for v in items):
            return (
                f"parameter {key!r} must be a string, number, boolean, null or a list of "
                f"them, got {type(value).__name__}"
            )
    return None


def describe_dynamic(signature: Sequence[Mapping[str, Any]]) -> str | None:
    """`input_ids [-1, -1], attention_mask [-1, -1]` for inputs declared to vary beyond the
    batch, for the start-up line; None when only dimension 0 varies."""
    parts = [
        f"{e['name']} {format_dims(dims_of(e))}"
        for e in signature
        if any(d == -1 for d in dims_of(e)[1:])
    ]
    return ", ".join(parts) or None


def stand_in_inputs(
    signature: Sequence[Mapping[str, Any]], resize: bool = False
) -> dict[str, np.ndarray]:
    """Zeros shaped like the example input (batch 1; strings are "a"), for checks and demo
    traffic. `resize`: every declared dynamic dimension past the batch one smaller (two
    when it is 1), to see that the model really takes other sizes there."""
    named: dict[str, np.ndarray] = {}
    for entry in signature:
        dims = dims_of(entry)
        shape = [1, *entry["shape"][1:]] if entry["shape"] else []
        if resize:
            shape = [
                (s - 1 if s > 1 else 2) if i and dims[i] == -1 else s for i, s in enumerate(shape)
            ]
        if entry["dtype"] == BYTES:
            named[entry["name"]] = np.full(shape, "a", dtype=object)
        elif entry["dtype"] == BF16:
            named[entry["name"]] = np.zeros(shape, dtype=_bf16_dtype())
        else:
            named[entry["name"]] = np.zeros(shape, dtype=WIRE_DTYPES[entry["dtype"]])
    return named


def _bf16_dtype() -> Any:
    """numpy's bfloat16 from ml_dtypes (which tritonclient brings); a clear error without."""
    try:
        import ml_dtypes
    except ImportError:
        raise ValueError(
            "a bfloat16 input needs the ml_dtypes package for numpy (pip install ml_dtypes)"
        ) from None
    return ml_dtypes.bfloat16

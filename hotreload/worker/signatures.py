"""A model's inputs and outputs as the wire sees them.

Inputs: the example's tensors (or strings), named, with the dimensions that may vary
(the model's declared `shapes`, else dimension 0). Outputs: whatever structure the model
returns (a tensor, tuples, dicts, a Hugging Face `ModelOutput`, strings) flattened into
named values, with `None` dropped and objects that cannot travel (a KV cache) set aside
for one note at load time.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from hotreload.protocol.text import BYTES, is_text

#: Input forms: how the wire tensors are passed to the model.
FORM_SINGLE, FORM_TUPLE, FORM_DICT = "single", "tuple", "dict"


class SignatureError(Exception):
    """An example or output the wire cannot carry; the message says what to change."""


_EXAMPLE_MUST = (
    "the example callable must return a tensor, a str or list of str, a tuple/list of them, "
    "or a dict of name -> tensor/str"
)


def _example_value(value: Any, name: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, str):
        return [value]  # one row: the model is always called with a list of str
    if is_text(value):
        return list(value)
    raise SignatureError(f"example input {name!r} is a {_what(value)}; {_EXAMPLE_MUST}")


def _what(value: Any) -> str:
    """The type of a value the wire cannot carry, with the fix for a numpy array."""
    if type(value).__module__ == "numpy":
        return f"numpy {type(value).__name__} (return torch.from_numpy(...) instead)"
    return type(value).__name__


def normalise_example(value: Any) -> tuple[str, dict[str, Any]]:
    """The example input as a form and named values (tensors, or lists of str)."""
    if isinstance(value, torch.Tensor) or is_text(value):
        return FORM_SINGLE, {"input": _example_value(value, "input")}
    if isinstance(value, (tuple, list)):
        named = {f"input_{i}": _example_value(v, f"input_{i}") for i, v in enumerate(value)}
        return FORM_TUPLE, named
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return FORM_DICT, {k: _example_value(v, k) for k, v in value.items()}
    raise SignatureError(f"{_EXAMPLE_MUST}; it returned {_what(value)}")


def entry(name: str, value: Any) -> dict[str, Any]:
    """One signature entry: name, dtype (`bytes` for strings) and shape."""
    if isinstance(value, torch.Tensor):
        return {
            "name": name,
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": list(value.shape),
        }
    return {"name": name, "dtype": BYTES, "shape": [len(value)] if isinstance(value, list) else []}


def input_signature(
    named: Mapping[str, Any], form: str, shapes: Mapping[str, list[int]] | None
) -> list[dict[str, Any]]:
    """Entries for the example's inputs with their `dims`: declared, or dimension 0 free."""
    declared = dict(shapes or {})
    if form == FORM_SINGLE and "input" not in declared and len(declared) == 1:
        # One input: whatever the user called it in `shapes`, it is this one.
        declared = {"input": next(iter(declared.values()))}
    unknown = sorted(set(declared) - set(named))
    if unknown:
        raise SignatureError(
            f"`shapes` names {', '.join(map(repr, unknown))}, but the example's inputs are "
            f"{', '.join(map(repr, named))} (a single-input model's input is 'input')"
        )
    out = []
    for name, value in named.items():
        e = entry(name, value)
        dims = declared.get(name)
        if dims is None:
            dims = [-1, *e["shape"][1:]] if e["shape"] else []
        elif len(dims) != len(e["shape"]):
            raise SignatureError(
                f"shapes.{name} = {dims} has {len(dims)} dimension(s), but the example's "
                f"{name!r} has shape {e['shape']}"
            )
        else:
            for i, (d, actual) in enumerate(zip(dims, e["shape"], strict=True)):
                if d != -1 and d != actual:
                    raise SignatureError(
                        f"shapes.{name} = {dims} fixes dimension {i} at {d}, but the "
                        f"example's {name!r} has {actual} there; use -1 or {actual}"
                    )
        e["dims"] = list(dims)
        out.append(e)
    return out


def accepted_parameters(model: Any) -> tuple[set[str], bool]:
    """Keyword names the model's call accepts beyond its inputs, and whether it takes
    **kwargs (then any parameter is passed)."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return set(), False
    names = {
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty
    }
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def parameter_problem(
    params: Mapping[str, Any], inputs: Iterable[str], accepted: tuple[set[str], bool]
) -> str | None:
    """Why a request's parameters cannot go to the model's call (`accepted` as
    `accepted_parameters` gives it), or None. One rule for the worker and the exported
    Triton and Ray models, each of which raises it as its own error."""
    names, any_kw = accepted
    clash = sorted(set(params) & set(inputs))
    if clash:
        return f"parameter(s) {clash} have the names of inputs; rename one of them"
    unknown = [] if any_kw else sorted(set(params) - names)
    if unknown:
        takes = ", ".join(sorted(names)) or "no keyword parameters"
        return f"the model does not take parameter(s) {unknown}; it takes {takes}"
    return None


def entry_under(wire: Mapping[str, Any], code: Path) -> dict[str, Any]:
    """An entry point as an export writes it, with its file inside the export's copy of
    the code (`code`)."""
    out = dict(wire)
    if out.get("file"):
        out["file"] = str(code / out["file"])
    return out


def _flatten(value: Any, name: str, out: dict[str, Any], dropped: dict[str, str]) -> None:
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        out[name] = value
    elif isinstance(value, (bool, int, float)):
        out[name] = torch.as_tensor(value)
    elif is_text(value):
        out[name] = value
    elif isinstance(value, Mapping):  # dicts, and transformers' ModelOutput
        for k, v in value.items():
            _flatten(v, f"{name}.{k}" if name else str(k), out, dropped)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _flatten(v, f"{name}.{i}", out, dropped)
    else:
        dropped[name] = type(value).__name__


def normalise_output(value: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The model's output as a form, named values (tensors or strings) and what was dropped
    (name -> type), for the wire and for smoke checks."""
    out: dict[str, Any] = {}
    dropped: dict[str, str] = {}
    if isinstance(value, torch.Tensor) or is_text(value) or isinstance(value, (bool, int, float)):
        _flatten(value, "output", out, dropped)
        return FORM_SINGLE, out, dropped
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return FORM_TUPLE, {f"output_{i}": v for i, v in enumerate(value)}, dropped
    if isinstance(value, Mapping):
        _flatten(value, "", out, dropped)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _flatten(v, f"output_{i}", out, dropped)
    else:
        raise SignatureError(
            f"the model returned a {type(value).__name__}, which cannot travel; return a "
            "tensor, str or list of str, or a tuple/list/dict of them"
        )
    if not out:
        kept = ", ".join(f"{k} ({t})" for k, t in dropped.items()) or "only None values"
        raise SignatureError(f"the model's output holds no tensor or string to send back: {kept}")
    return FORM_DICT, out, dropped


def dropped_note(dropped: Mapping[str, str]) -> str | None:
    """One sentence about outputs left out of every reply, or None."""
    if not dropped:
        return None
    fields = ", ".join(f"{k!r} ({t})" for k, t in dropped.items())
    hint = ""
    if any("Cache" in t for t in dropped.values()):
        hint = "; to stop computing the cache, build the model with use_cache=False"
    return f"output field(s) {fields} cannot travel and are left out of every reply{hint}"


def output_signature(named: Mapping[str, Any], form: str) -> list[dict[str, Any]]:
    return [{**entry(k, v), "form": form} for k, v in named.items()]

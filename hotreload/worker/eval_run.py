"""Score the serving version with the config's `eval = "evals.py:score"`: the callable is
given the model (what the factory built, weights and pushes in place) and returns a dict of
floats. It runs on the worker's eval thread, beside the requests (never on the serving
thread) and in inference mode, as the requests do. LoadError says what is wrong with what
it returned, or names what it raised (the engine shows it; the version serves on)."""

from __future__ import annotations

import math
import numbers
import time
from pathlib import Path
from typing import Any

import torch

from hotreload.protocol.messages import EvalReply
from hotreload.worker.load_error import LoadError

#: Figures an eval may return: they travel in events and the history.
MAX_FIGURES = 64


def run_eval(model: Any, version: int, spec: dict[str, Any]) -> EvalReply:
    from hotreload.worker.loader import resolve  # loader imports the worker's modules

    entry = spec.get("eval")
    if not entry:
        raise LoadError("no `eval` is configured for this model")
    fn = resolve(entry, Path(spec["root"]))
    started = time.perf_counter()
    try:
        with torch.inference_mode():
            made = fn(model)
    except Exception as exc:
        raise LoadError(f"eval: {entry['spec']} raised {type(exc).__name__}: {exc}") from None
    return EvalReply(version, figures(entry["spec"], made), time.perf_counter() - started)


def figures(spec: str, made: Any) -> dict[str, float]:
    """`made` as name -> float, or LoadError saying what to return instead."""
    if not isinstance(made, dict):
        raise LoadError(
            f"eval: {spec} returned {type(made).__name__}; return a dict of floats, such as "
            '{"loss": 0.41, "accuracy": 0.87}'
        )
    if len(made) > MAX_FIGURES:
        raise LoadError(f"eval: {spec} returned {len(made)} figures; return {MAX_FIGURES} at most")
    out: dict[str, float] = {}
    for name, value in made.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(name, str) or not name:
            raise LoadError(f"eval: {spec} returned the key {name!r}; name each figure by a string")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise LoadError(
                f"eval: {spec} returned {name!r}: {type(value).__name__}; each value must be a "
                "number (a float, an int, or a one-element tensor)"
            )
        value = float(value)
        if not math.isfinite(value):
            raise LoadError(f"eval: {spec} returned {name!r}: {value}, not a finite number")
        out[name] = value
    return out

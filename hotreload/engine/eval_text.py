"""An eval's result in words (engine/model/evals.py makes it), for `status` and the report:
a module of its own, so a command that prints it imports nothing else of the engine."""

from __future__ import annotations

from typing import Any


def eval_text(result: dict[str, Any]) -> str:
    """`loss 0.4124, accuracy 0.875 (0.25 s)`, or `FAILED: <why>`."""
    if result.get("error"):
        return f"FAILED: {result['error']}"
    shown = ", ".join(f"{k} {v:.4g}" for k, v in (result.get("figures") or {}).items())
    took = f" ({result['eval_s']:.2f} s)" if result.get("eval_s") is not None else ""
    return (shown or "no figures") + took

"""`eval` and `eval_timeout_s` of a model: a function every new version (an edit, a push, a
rollback) is scored with once it serves, off the request path (engine/model/evals.py).

    eval = "evals.py:score"   # called with the model; returns a dict of floats
    eval_timeout_s = 60       # past it, the eval is reported as timed out (the version serves)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.config.checker import Checker

#: Seconds an eval may take by default.
EVAL_TIMEOUT_S = 60.0


def parse_eval(m: Checker, root: Path, parse_entry: Callable[..., Any]) -> tuple[Any | None, float]:
    """(`eval` as an EntryPoint or None, `eval_timeout_s`), checked. `parse_entry` is
    models.parse_entry (models imports this module)."""
    raw = m.get("eval", str, None, 'a string such as "evals.py:score"')
    entry = parse_entry(raw, checker=m, key="eval", root=root) if raw is not None else None
    timeout = m.number("eval_timeout_s", EVAL_TIMEOUT_S, minimum=0.001, what="seconds")
    if "eval_timeout_s" in m.table and entry is None:
        m.fail(
            m.sub("eval_timeout_s"),
            'eval_timeout_s bounds the eval: set eval = "evals.py:score" as well (or remove '
            "eval_timeout_s)",
        )
    return entry, float(timeout or EVAL_TIMEOUT_S)

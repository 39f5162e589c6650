"""The building process is the one the kernel's OOM killer picks.

The OOM killer picks the largest process, and a serving worker holding a whole model is
larger than a standby's build half way: a build that ran out of memory killed the serving
worker. So a build raises this process's `oom_score_adj` to the maximum while it runs, and
sets it back after (an unprivileged process may lower it back to where it was, never below).

Outside a build a worker still sits `WORKER_OOM_SCORE_OFFSET` above the manager that started
it: under `inplace` the serving worker builds the next version itself, and an out-of-memory
there took the manager down too. The manager holds no model; with every worker marked first,
the session lives to restart one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: The score a build runs with: the kernel's maximum, "kill this one first".
BUILD_OOM_SCORE_ADJ = 1000
_PATH = "/proc/self/oom_score_adj"
#: How far above its manager a worker's score is set when it starts (the kernel's range is
#: -1000..1000; half of it outweighs any manager's size against a worker holding a model).
WORKER_OOM_SCORE_OFFSET = 500


def _read() -> int | None:
    try:
        with open(_PATH, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _write(value: int) -> bool:
    try:
        with open(_PATH, "w", encoding="ascii") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


def mark_worker() -> int | None:
    """Raise this (just started) worker's score above the manager's it inherited; the score
    it now has, or None where /proc cannot say."""
    inherited = _read()
    if inherited is None:
        return None
    target = min(BUILD_OOM_SCORE_ADJ, inherited + WORKER_OOM_SCORE_OFFSET)
    return target if target > inherited and _write(target) else inherited


def while_building(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with this process first in line for the OOM killer, then back."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = _read()
        raised = before is not None and before < BUILD_OOM_SCORE_ADJ and _write(BUILD_OOM_SCORE_ADJ)
        try:
            return fn(*args, **kwargs)
        finally:
            if raised and before is not None:
                _write(before)

    return wrapper

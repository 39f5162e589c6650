"""The building process is the one the kernel's OOM killer picks.

When a standby worker's build ran out of memory, the kernel killed the serving worker
6 ms after it: the OOM killer picks the largest process, and the serving one, holding a
whole model, was larger than the build half way. A build therefore raises this process's
`oom_score_adj` to the maximum while it runs, and sets it back after: a build that runs
out of memory loses itself, and the version that serves stays up. (An unprivileged
process may raise its score and lower it back to where it was; never below.)

Outside a build, a worker still sits above the manager that started it
(`WORKER_OOM_SCORE_OFFSET`): under `inplace` the serving worker builds, warms and smoke-tests
the next version itself, and an out-of-memory there killed the worker and, 9 ms later, the
manager too (1 run in 4, in a 1.5 GiB cgroup). The manager holds no model; with the worker
marked, the kernel takes every worker first, and the session lives to restart one.
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

"""The building process is the one the kernel's OOM killer picks.

When a standby worker's build ran out of memory, the kernel killed the serving worker
6 ms after it: the OOM killer picks the largest process, and the serving one, holding a
whole model, was larger than the build half way. A build therefore raises this process's
`oom_score_adj` to the maximum while it runs, and sets it back after: a build that runs
out of memory loses itself, and the version that serves stays up. (An unprivileged
process may raise its score and lower it back to where it was; never below.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: The score a build runs with: the kernel's maximum, "kill this one first".
BUILD_OOM_SCORE_ADJ = 1000
_PATH = "/proc/self/oom_score_adj"


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

"""Builds run off the serving CPUs (`cpus` in the config; the manager's side is
engine/cpus.py).

The manager moves a whole worker process onto the serving CPUs when it starts serving; it
cannot tell which threads do builds (the loader thread, and those a build starts: torch's
OpenMP pool, a user's prefetch thread, which begin on their creator's CPUs). So the loader
thread puts itself, and every thread started during an earlier build, back on the build CPUs
before each task; idle between tasks, they cost nothing wherever the manager left them. A
thread another thread happens to start while a build runs counts as the build's: rare (a
pool starts once), and it only runs on the build CPUs.
"""

from __future__ import annotations

import contextlib
import os
import threading


def thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


class BuildPlacement:
    """Used by the loader thread around each of its tasks."""

    def __init__(self, cpus: list[int] | frozenset[int]) -> None:
        self.cpus = frozenset(cpus)
        #: Threads started during builds (loader's included), still alive or not.
        self.build_threads: set[int] = set()
        self._before: set[int] = set()

    def enter(self) -> None:
        me = threading.get_native_id()
        alive = thread_ids()
        self.build_threads &= alive  # ids of ended threads may be reused
        for tid in {me} | self.build_threads:
            # Not allowed or just ended: the build runs where it is, nothing else changes.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, self.cpus)
        self._before = alive

    def leave(self) -> None:
        self.build_threads |= thread_ids() - self._before

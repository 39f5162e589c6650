"""`keep_off_serving_cpus`: a trainer moved off the CPUs its session's serving workers are
pinned to (read from the workers' own affinity), or left alone with a note saying why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hotreload.training.cpus import keep_off_serving_cpus, serving_cpus

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs",
)

MOVE = """
import json, os, sys
from hotreload.training.cpus import keep_off_serving_cpus

class Status:  # the session's answer, with the stand-in serving worker's pid
    def status(self):
        return {"models": [{"name": "m", "pid": int(sys.argv[1])}]}

move = keep_off_serving_cpus(Status())
print(json.dumps({"text": str(move), "now": sorted(os.sched_getaffinity(0)),
                  "omp": os.environ.get("OMP_NUM_THREADS")}))
"""


class _Status:
    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def status(self) -> dict:
        return {"models": [{"name": "m", "pid": self.pid, "cpus_unpinned": "threads unset"}]}


def test_a_trainer_moves_off_a_pinned_worker_and_sets_its_thread_count() -> None:
    mine = sorted(os.sched_getaffinity(0))
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.sched_setaffinity(worker.pid, {mine[-1]})
        out = subprocess.run(
            [sys.executable, "-c", MOVE, str(worker.pid)],
            capture_output=True, text=True, timeout=110,
        )  # fmt: skip
    finally:
        worker.kill()
        worker.wait(10)
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    # torch not imported yet: its thread count is set for when it is.
    assert got["now"] == mine[:-1] and got["omp"] == str(len(mine) - 1)
    assert f"off CPU {mine[-1]} where the serving workers run" in got["text"]


def test_nothing_pinned_or_nothing_to_spare_changes_nothing() -> None:
    before = os.sched_getaffinity(0)
    move = keep_off_serving_cpus(_Status(os.getpid()))  # a worker allowed everywhere
    assert not move.moved and os.sched_getaffinity(0) == before
    assert "model 'm' is not pinned (threads unset)" in str(move)
    move = keep_off_serving_cpus(_Status(None))
    assert not move.moved and "has no serving worker" in str(move)
    assert serving_cpus({"models": []}) == (frozenset(), [])

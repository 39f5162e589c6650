"""A build is the process the OOM killer picks (issue 30, item 9): the building process
raises its `oom_score_adj` for the build, and in a memory cgroup that runs out the builder
dies, not the larger serving process beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, wait_until

BUILDER = """
import sys, time
from hotreload.worker.oom import while_building

def read():
    return open("/proc/self/oom_score_adj").read().strip()

def build():
    print("during", read(), flush=True)
    if sys.argv[1] == "grow":
        blocks = []
        while True:  # a build that runs out of memory
            blocks.append(bytearray(8 << 20))
            time.sleep(0.01)

print("before", read(), flush=True)
while_building(build)()
print("after", read(), flush=True)
"""
SERVER = """
import time
block = bytearray(96 << 20)  # a served model: larger than the build when memory runs out
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
time.sleep(120)
"""
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def test_a_build_raises_its_oom_score_and_lowers_it_after() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BUILDER, "once"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split() for line in out.stdout.splitlines())
    assert lines["during"] == "1000" and lines["after"] == lines["before"], lines


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    group = CGROUP_ROOT / f"hotreload-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(160 << 20))
        if (group / "memory.swappiness").exists():
            (group / "memory.swappiness").write_text("0")
    except OSError as exc:
        pytest.skip(f"no memory cgroup (v1) can be made here: {exc}")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _in_group(group: Path, code: str, *args: str) -> subprocess.Popen[str]:
    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=join,
    )


def test_in_a_full_memory_cgroup_the_builder_dies_not_the_server(memory_cgroup: Path) -> None:
    server = _in_group(memory_cgroup, SERVER)
    builder = None
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        builder = _in_group(memory_cgroup, BUILDER, "grow")
        builder.wait(60)
        assert builder.returncode == -signal.SIGKILL, builder.returncode
        assert server.poll() is None, "the OOM killer took the serving process"
    finally:
        for p in (server, builder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


def test_a_served_worker_sits_above_its_manager_for_the_oom_killer(
    project: Path, serve: Any
) -> None:
    """Issue 38, item 5: under `inplace` the serving worker builds, warms and smoke-tests the
    next version itself; outside a build it must still be picked before the manager. Under
    `respawn`: the serving worker, which built v1 itself as an `inplace` one does, and the
    standby (every worker marks itself as it starts, whatever the strategy)."""

    def score(pid: int) -> int:
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())

    text = project.read_text().replace('strategy = "inplace"', 'strategy = "respawn"')
    project.write_text(text)
    session = serve(project)
    manager = score(session.proc.pid)

    def marked() -> bool:
        # A standby still starting Python (before the worker's first line) holds no
        # memory yet: wait for it to mark itself.
        workers = session.worker_pids()
        return len(workers) >= 2 and all(score(w) >= min(1000, manager + 500) for w in workers)

    wait_until(
        marked, 30, what="the serving worker's and the standby's oom_score_adj over the manager's"
    )


GROWING_WORKER = """
import time
from hotreload.worker.oom import mark_worker

mark_worker()
print("marked", open("/proc/self/oom_score_adj").read().strip(), flush=True)
blocks = []
while True:  # a warm-up (not a build) that runs out of memory
    blocks.append(bytearray(8 << 20))
    time.sleep(0.01)
"""


def test_in_a_full_memory_cgroup_a_worker_dies_not_its_larger_manager(
    memory_cgroup: Path,
) -> None:
    manager = _in_group(memory_cgroup, SERVER)  # larger than the worker when memory runs out
    worker = None
    try:
        assert manager.stdout is not None and manager.stdout.readline().strip() == "ready"
        worker = _in_group(memory_cgroup, GROWING_WORKER)
        worker.wait(60)
        assert worker.returncode == -signal.SIGKILL, worker.returncode
        assert manager.poll() is None, "the OOM killer took the manager"
    finally:
        for p in (manager, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)

"""Memory as the kernel sees it: cgroup limits (v1 and v2, read from a /proc and /sys of the
test's own making), an OOM-killed worker reported as that with its last RSS and the limit,
and `policy = "auto"` counting the limit. The last two run a real session in a real memory
cgroup, so they need root and a writable memory controller."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hotreload import Client
from hotreload.engine.memory_limits import MIB, cgroup_memory, describe_oom_kill, oom_kills
from hotreload.errors import ClientError
from tests.support import ServeProcess, make_project, read_events, wait_until


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_v2_limit_is_the_tightest_up_the_tree_less_reclaimable_cache(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    write(proc, {"self/cgroup": "0::/user.slice/app.scope\n"})
    write(
        sys,
        {
            "user.slice/app.scope/memory.max": "max\n",
            "user.slice/memory.max": f"{2048 * MIB}\n",
            "user.slice/memory.current": f"{900 * MIB}\n",
            "user.slice/memory.stat": f"anon 1\ninactive_file {100 * MIB}\n",
            "memory.max": f"{4096 * MIB}\n",
        },
    )
    got = cgroup_memory(proc=proc, sys=sys)
    assert got is not None and got.limit_bytes == 2048 * MIB
    assert got.free_bytes == (2048 - 800) * MIB and got.where.endswith("user.slice")


def test_v1_limit_and_a_namespaced_path(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    write(proc, {"self/cgroup": "5:cpu:/\n4:memory:/docker/abc\n"})
    write(
        sys,
        {
            "memory/docker/abc/memory.limit_in_bytes": f"{512 * MIB}\n",
            "memory/docker/abc/memory.usage_in_bytes": f"{100 * MIB}\n",
            "memory/docker/abc/memory.stat": f"total_inactive_file {20 * MIB}\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    got = cgroup_memory(proc=proc, sys=sys)
    assert got is not None and (got.limit_bytes, got.used_bytes) == (512 * MIB, 80 * MIB)
    # In a cgroup namespace the path names nothing under the mount: its root is ours.
    write(proc, {"self/cgroup": "4:memory:/kubepods/pod1\n"})
    write(sys, {"memory/memory.limit_in_bytes": f"{256 * MIB}\n"})
    got = cgroup_memory(proc=proc, sys=sys)
    assert got is not None and got.limit_bytes == 256 * MIB


def test_no_limit_and_no_cgroup_files_read_as_none(tmp_path: Path) -> None:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    write(proc, {"self/cgroup": "0::/\n"})
    write(sys, {"memory.max": "max\n"})
    assert cgroup_memory(proc=proc, sys=sys) is None
    assert cgroup_memory(proc=tmp_path / "nothing", sys=sys) is None


def test_the_oom_reason_names_rss_and_limit() -> None:
    text = describe_oom_kill(300 * MIB, 1900 * MIB, None)
    assert text.startswith("the kernel killed the worker for memory")
    assert "last RSS 300 MiB" in text and "peak 1900 MiB" in text
    assert "no cgroup memory limit" in text


# ---------------------------------------------------------------------- a real cgroup


class MemoryCgroup:
    """A child memory cgroup of this process's own: `add(pid)`, `limit(bytes)`."""

    def __init__(self, folder: Path, v2: bool) -> None:
        self.folder = folder
        self.limit_file = folder / ("memory.max" if v2 else "memory.limit_in_bytes")

    def add(self, pid: int) -> None:
        (self.folder / "cgroup.procs").write_text(f"{pid}\n")

    def limit(self, nbytes: int) -> None:
        self.limit_file.write_text(f"{nbytes}\n")


def _own_memory_cgroup() -> tuple[Path, bool] | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / rel.lstrip("/"), False
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / rel.lstrip("/")
            if "memory" in (folder / "cgroup.subtree_control").read_text(errors="replace"):
                return folder, True
    return None


@pytest.fixture
def memory_cgroup() -> Iterator[MemoryCgroup]:
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    own = _own_memory_cgroup()
    if own is None or not own[0].is_dir():
        pytest.skip("no memory cgroup controller this process can make a child of")
    folder = own[0] / f"hotreload-test-{secrets.token_hex(4)}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    cg = MemoryCgroup(folder, own[1])
    try:
        yield cg
    finally:
        # The session's processes are gone by now (the serve fixture stopped them first).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                folder.rmdir()
                break
            time.sleep(0.1)


HOG = """
import os
import torch

class Hog(torch.nn.Module):
    def forward(self, x):
        mib = int(x[0, 0])
        if mib > 0 and os.path.exists("{flag}"):
            os.remove("{flag}")  # once: a retry after the kill computes normally
            block = torch.ones(mib * 2**18)  # float32: `mib` MiB, every page written
            return x + block[:1].sum()
        return x * 2

def build():
    return Hog()

def example():
    return torch.zeros((1, 4))
"""
HOG_CONFIG = """
[[models]]
name = "hog"
entry = "hog.py:build"
example = "hog.py:example"
threads = 1
request_timeout_s = 60
"""


def move_session(serve_proc: ServeProcess, cg: MemoryCgroup) -> None:
    for pid in [serve_proc.proc.pid, *serve_proc.worker_pids()]:
        with contextlib.suppress(ProcessLookupError, OSError):
            cg.add(pid)


@pytest.mark.skipif(oom_kills() is None, reason="/proc/vmstat has no oom_kill counter")
def test_an_oom_killed_worker_reads_as_that(
    tmp_path: Path, memory_cgroup: MemoryCgroup, serve: ServeProcess.Factory
) -> None:
    flag = tmp_path / "hog-now"
    config = make_project(tmp_path, config=HOG_CONFIG, files={"hog.py": HOG.format(flag=flag)})
    session = serve(config)
    # The worker alone: with the manager in there too, the kernel may take it as well (then
    # nobody is left to report). Charges stay where they were made: only the hog's new
    # 2 GiB land here.
    memory_cgroup.limit(400 * MIB)
    with Client(config, timeout_s=60) as client:
        memory_cgroup.add(client.status()["models"][0]["pid"])

        def limit_seen() -> bool:
            return client.status()["models"][0]["memory_limit_bytes"] == 400 * MIB

        wait_until(limit_seen, 30, what="the session to see the worker's memory limit")
    flag.write_text("")
    x = np.zeros((1, 4), dtype=np.float32)
    x[0, 0] = 2048  # MiB
    with Client(config, timeout_s=60) as client, contextlib.suppress(ClientError):
        client.infer("hog", x)  # the retry on the restarted worker may well succeed

    def died() -> list[dict]:
        return [e for e in read_events(config) if e["kind"] == "worker_died"]

    (event,) = wait_until(died, 60, what="the worker_died event")
    reason = event["reason"]
    assert reason.startswith("the kernel killed the worker for memory"), reason
    assert "last RSS" in reason and "cgroup memory limit" in reason, reason
    assert "Connection reset" not in reason
    assert session.proc.poll() is None  # the session serves on


def test_policy_auto_counts_the_cgroup_limit(
    project: Path, memory_cgroup: MemoryCgroup, serve: ServeProcess.Factory
) -> None:
    session = serve(project)
    move_session(session, memory_cgroup)
    memory_cgroup.limit(200 * MIB)  # host RAM is plenty; the cgroup leaves < the margin
    with Client(project, timeout_s=60) as client:
        client.reload("mlp", force=True)
    (policy,) = [e for e in read_events(project) if e["kind"] == "policy"]
    assert policy["policy"] == "resource", policy
    assert "cgroup memory limit (200 MiB" in policy["reason"], policy

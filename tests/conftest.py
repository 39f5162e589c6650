"""Shared fixtures. Anything that starts a process cleans it up here, even on failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import SHARED, ServeProcess, make_project

# Reload locks of test sessions live in a folder of this run, not the machine-wide one, so a
# hotreload a developer runs meanwhile neither blocks nor is blocked by the tests.
os.environ.setdefault("HOTRELOAD_LOCK_DIR", tempfile.mkdtemp(prefix="hotreload-test-locks-"))


def _nvidia_gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # get_closest_marker, not keywords: keywords include folder names (tests/gpu/...).
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if marked and not _nvidia_gpu_present():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi -L found none)")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example MLP project in a temporary folder; returns its config path."""
    return make_project(tmp_path)


@pytest.fixture
def serve() -> Iterator[ServeProcess.Factory]:
    """Start `hotreload serve` processes; every one is stopped (then killed) at teardown."""
    started: list[ServeProcess] = []

    def factory(
        config: Path,
        *args: str,
        wait_ready: bool = True,
        command: str = "serve",
        env: dict[str, str] | None = None,
        process_cls: type[ServeProcess] = ServeProcess,
    ) -> ServeProcess:
        proc = process_cls(config, *args, command=command, env=env)
        started.append(proc)
        if wait_ready:
            proc.wait_ready()
        return proc

    yield factory
    for proc in started:
        proc.close()


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    """Fail a test that leaves a child process of ours behind (after its fixtures ran).
    Trees under a pid in `tests.support.SHARED` (a module's shared server) are left alone."""
    yield
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 10
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline:
        kids = [p for p in me.children(recursive=True) if _counts(p)]
        if not kids:
            return
        time.sleep(0.1)
    described = []
    for p in kids:
        try:
            described.append((p.pid, " ".join(p.cmdline())[:100]))
            os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    pytest.fail(f"leftover child processes: {described}", pytrace=False)


def _counts(p: psutil.Process) -> bool:
    """A live child that no shared server of a module owns."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        chain = [p, *p.parents()]
    except psutil.NoSuchProcess:
        return False
    return not any(q.pid in SHARED for q in chain)

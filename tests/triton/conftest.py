"""A real tritonserver (the nvidia-pytriton wheel's) on an exported repository, and a
hotreload session on the same config, both shared by the tests of a module.

Every process is started with its own process group and killed as a group at teardown,
even when a test or the start-up fails; every wait has a deadline; ports are free ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import psutil
import pytest

from hotreload.export.local_triton import LocalTriton, find_local_triton
from tests.triton.support_triton import SHARED


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    """As the suite's own check, but the module's shared servers may outlive one test."""
    yield
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 10
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline:
        kids = [p for p in me.children(recursive=True) if not _shared(p)]
        if not kids:
            return
        time.sleep(0.1)
    pytest.fail(f"leftover child processes: {[p.pid for p in kids]}", pytrace=False)


def _shared(p: psutil.Process) -> bool:
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return True
        chain = [p, *p.parents()]
    except psutil.NoSuchProcess:
        return True
    return any(q.pid in SHARED for q in chain)


@pytest.fixture(scope="session")
def local_triton() -> LocalTriton:
    found = find_local_triton()
    if isinstance(found, str):
        pytest.skip(found)
    return found

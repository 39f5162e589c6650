"""A real tritonserver (the nvidia-pytriton wheel's) on an exported repository, and a
hotreload session on the same config, both shared by the tests of a module.

Every process is started with its own process group and killed as a group at teardown,
even when a test or the start-up fails; every wait has a deadline; ports are free ones.
"""

from __future__ import annotations

import pytest

from hotreload.export.local_triton import LocalTriton, find_local_triton


@pytest.fixture(scope="session")
def local_triton() -> LocalTriton:
    found = find_local_triton()
    if isinstance(found, str):
        pytest.skip(found)
    return found

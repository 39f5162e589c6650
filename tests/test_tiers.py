"""The fast tier (`./scripts/test.sh --quick`): tests that start no worker process. A test
there that starts one fails at once with what to do, instead of slowing the tier unnoticed;
the files listed as real are marked so (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO

#: Plugins none of the runs below uses, left out of them: importing them is most of a
#: pytest start (hypothesis alone: 2 s of CPU).
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:textual-snapshot", "-p", "no:syrupy")


def _pytest(*args: str, tier: str | None) -> subprocess.CompletedProcess[str]:
    # A run of its own: not this one's tier, nor (under `-n`) this xdist worker's identity.
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "HOTRELOAD_TEST_TIER" and not k.startswith("PYTEST_XDIST")
    }
    if tier is not None:
        env["HOTRELOAD_TEST_TIER"] = tier
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNUSED_PLUGINS, "-q", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip


STARTS_A_WORKER = (
    "tests/hardening/test_oom_choice.py"
    "::test_a_served_worker_sits_above_its_manager_for_the_oom_killer"
)


# The xdist case starts a worker process of pytest's: slow, so in the full suite only.
XDIST = pytest.param(["-n", "1"], id="xdist", marks=pytest.mark.slow)


@pytest.mark.parametrize("workers", [pytest.param([], id="one-process"), XDIST])
def test_a_test_that_starts_a_worker_fails_in_the_quick_tier_saying_what_to_do(
    workers: list[str],
) -> None:
    """Also on a pytest-xdist worker (the tier runs `-n`): the guard is set up there too."""
    out = _pytest(*workers, STARTS_A_WORKER, tier="quick")
    assert out.returncode != 0, out.stdout
    assert "starts a real worker process" in out.stdout, out.stdout[-3000:]
    assert "REAL_FILES in tests/conftest.py" in out.stdout


def test_the_real_files_are_left_out_of_the_quick_selection() -> None:
    # Two files listed as real and two of the quick tier: the selection follows the marks
    # tests/conftest.py gives file by file, so four files show it.
    files = ["tests/test_reload.py", "tests/test_worker_ops.py", "tests/test_tiers.py",
             "tests/test_config_change_message.py"]  # fmt: skip
    out = _pytest("--collect-only", "-m", "not real and not slow", *files, tier="quick")
    assert out.returncode == 0, out.stdout[-3000:]
    assert "tests/test_reload.py" not in out.stdout and "test_worker_ops.py" not in out.stdout
    assert "test_tiers.py" in out.stdout and "test_config_change_message.py" in out.stdout

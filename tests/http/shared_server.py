"""Sessions shared across the tests of `tests/http` (tests.support.shared_server starts them)."""

from __future__ import annotations

from pathlib import Path


def unpinned(config: Path) -> Path:
    """`config` with `cpus = "off"` in every model's table. For a session a fixture keeps
    for a whole xdist worker's life: pinned, it would hold its CPU claim (engine/cpus.py)
    all that time, and every later session on that worker would find no CPU to claim, failing
    the tests that prove the pinning (tests/test_cpus.py, the dashboard's)."""
    text = config.read_text().replace("[[models]]\n", '[[models]]\ncpus = "off"\n')
    config.write_text(text)
    return config

"""`keep_versions`: how many good versions a model keeps for `hotreload rollback`."""

from __future__ import annotations

from pathlib import Path

from hotreload.config import load_config
from tests.test_config import GOOD_MODEL, error_for, write


def test_keep_versions_defaults_to_three_and_takes_a_count(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, GOOD_MODEL)).models[0].keep_versions == 3
    kept = load_config(write(tmp_path, GOOD_MODEL + "keep_versions = 5\n"))
    assert kept.models[0].keep_versions == 5


def test_a_bad_keep_versions_says_what_to_write(tmp_path: Path) -> None:
    zero = error_for(tmp_path, GOOD_MODEL + "keep_versions = 0\n")
    assert "keep_versions" in zero and "between 1 and 100, got 0" in zero
    text = error_for(tmp_path, GOOD_MODEL + 'keep_versions = "all"\n')
    assert "keep_versions" in text and "an integer" in text

"""Snapshots of the last good version: what a restart comes back with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hotreload.config import load_config
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.snapshots import take_snapshot
from tests.support import make_project


def test_files_unchanged_since_the_last_snapshot_are_linked_not_copied(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = load_config(config).models[0]
    base, rules = tmp_path / "snapshots", IgnoreRules()
    first = take_snapshot(base, model, 1, rules)
    code = config.parent / "model.py"
    code.write_text(code.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
    second = take_snapshot(base, model, 2, rules, previous=first)

    weights = model.weights[0]
    assert second.remap(weights).stat().st_ino == first.remap(weights).stat().st_ino
    assert second.remap(code).stat().st_ino != first.remap(code).stat().st_ino
    assert "SCALE = 2.0" in second.remap(code).read_text()
    assert "SCALE = 1.0" in first.remap(code).read_text()

    # The first snapshot goes once the second version serves; the second keeps every byte.
    shutil.rmtree(first.folder)
    assert second.remap(weights).read_bytes() == weights.read_bytes()
    assert second.remap(code).read_text() == code.read_text()


def test_a_file_rewritten_with_the_same_size_is_copied_again(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = load_config(config).models[0]
    base, rules = tmp_path / "snapshots", IgnoreRules()
    first = take_snapshot(base, model, 1, rules)
    weights = model.weights[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same length, new bytes (and a new modification time)
    weights.write_bytes(bytes(data))
    second = take_snapshot(base, model, 2, rules, previous=first)
    assert second.remap(weights).read_bytes() == bytes(data)
    assert first.remap(weights).read_bytes() != bytes(data)


def test_a_file_written_just_before_the_last_snapshot_is_not_trusted_by_its_time(
    tmp_path: Path,
) -> None:
    """File times tick coarsely: a same-size rewrite right after a copy may keep the time."""
    config = make_project(tmp_path)
    model = load_config(config).models[0]
    base, rules = tmp_path / "snapshots", IgnoreRules()
    code = config.parent / "model.py"
    code.write_text(code.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
    first = take_snapshot(base, model, 1, rules)  # taken right after that write
    stamp = code.stat().st_mtime_ns
    code.write_text(code.read_text().replace("SCALE = 2.0", "SCALE = 3.0"))
    os.utime(code, ns=(stamp, stamp))  # the same tick
    second = take_snapshot(base, model, 2, rules, previous=first)
    assert "SCALE = 3.0" in second.remap(code).read_text()

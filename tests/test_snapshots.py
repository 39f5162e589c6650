"""Snapshots of the last good version: what a restart comes back with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from hotreload.config import load_config
from hotreload.engine import snapshots
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.snapshots import take_snapshot
from tests.support import make_project


def project(tmp_path: Path) -> tuple[Path, Any, Path]:
    config = make_project(tmp_path)
    return config, load_config(config).models[0], tmp_path / "snapshots"


def test_files_unchanged_since_the_last_snapshot_are_linked_not_copied(tmp_path: Path) -> None:
    config, model, base = project(tmp_path)
    rules = IgnoreRules()
    first = take_snapshot(base, model, 1, rules)
    code = config.parent / "model.py"
    code.write_text(code.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
    # settle_ns=0: the files were all written a moment ago, in this test.
    second = take_snapshot(base, model, 2, rules, previous=first, settle_ns=0)

    weights = model.weights[0]
    assert second.remap(weights).stat().st_ino == first.remap(weights).stat().st_ino
    assert second.remap(code).stat().st_ino != first.remap(code).stat().st_ino
    assert "SCALE = 2.0" in second.remap(code).read_text()
    assert "SCALE = 1.0" in first.remap(code).read_text()

    # The first snapshot goes once the second version serves; the second keeps every byte.
    shutil.rmtree(first.folder)
    assert second.remap(weights).read_bytes() == weights.read_bytes()
    assert second.remap(code).read_text() == code.read_text()


def test_a_file_rewritten_with_the_same_size_and_time_is_copied_again(tmp_path: Path) -> None:
    _, model, base = project(tmp_path)
    rules = IgnoreRules()
    first = take_snapshot(base, model, 1, rules)
    weights = model.weights[0]
    stamp = weights.stat().st_mtime_ns
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same length, new bytes
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stamp, stamp))  # and the old modification time
    second = take_snapshot(base, model, 2, rules, previous=first, settle_ns=0)
    assert second.remap(weights).read_bytes() == bytes(data)
    assert first.remap(weights).read_bytes() != bytes(data)


def test_a_file_changed_shortly_before_the_last_snapshot_is_not_reused(tmp_path: Path) -> None:
    """File times tick coarsely (1 to 2 s on some file systems): a file changed just before
    a snapshot might change again within the same tick, so it is copied, not trusted."""
    config, model, base = project(tmp_path)
    rules = IgnoreRules()
    first = take_snapshot(base, model, 1, rules)  # every file was just written
    second = take_snapshot(base, model, 2, rules, previous=first)
    code = config.parent / "model.py"
    assert second.remap(code).stat().st_ino != first.remap(code).stat().st_ino


def test_a_large_file_rewritten_in_place_is_reported_and_a_replaced_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshots, "LINK_ABOVE_BYTES", 1024)  # the example's weights: linked
    _, model, base = project(tmp_path)
    weights = model.weights[0]
    old = weights.read_bytes()
    snap = take_snapshot(base, model, 1, IgnoreRules())
    assert snap.remap(weights).stat().st_ino == weights.stat().st_ino
    assert snap.rewritten() == []

    fresh = weights.with_suffix(".tmp")
    fresh.write_bytes(old[::-1])
    os.replace(fresh, weights)  # an atomic save: the link keeps the old bytes
    assert snap.rewritten() == [] and snap.remap(weights).read_bytes() == old

    snap = take_snapshot(base, model, 2, IgnoreRules())
    with weights.open("r+b") as f:  # torch.save to the same path: the linked bytes change
        f.write(b"\0" * 16)
    assert snap.rewritten() == [weights]

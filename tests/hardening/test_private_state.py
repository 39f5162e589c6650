"""What a session writes is the owner's alone, and it never chmods a folder that is not
its own to do so (issue 30, items 3 and 5)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.snapshots import take_snapshot
from hotreload.errors import HotreloadError
from hotreload.paths import ensure_private_dir, ensure_state_dir
from tests.support import make_project


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_snapshots_are_0700_folders_of_0600_files(tmp_path: Path) -> None:
    config = load_config(make_project(tmp_path))
    base = tmp_path / "cache" / "hotreload" / "snapshots" / "abc" / "session-1" / "mlp"
    snap = take_snapshot(base, config.models[0], 1, IgnoreRules())
    folders = [p for p in (tmp_path / "cache").rglob("*") if p.is_dir()]
    files = [p for p in snap.folder.rglob("*") if p.is_file() and p.stat().st_nlink == 1]
    assert folders and files
    assert {mode(p) for p in [tmp_path / "cache", *folders]} == {0o700}
    assert {mode(p) for p in files} == {0o600}


def test_a_shared_folder_is_refused_not_chmodded(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    with pytest.raises(HotreloadError, match="is shared"):
        ensure_state_dir(shared)
    with pytest.raises(HotreloadError, match="is shared"):
        ensure_private_dir(shared)
    assert mode(shared) == 0o1777 and not (shared / ".gitignore").exists()
    # A folder of the user's own that is readable by others is refused too, with the fix.
    mine = tmp_path / "mine"  # (not named like a folder of hotreload's)
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    with pytest.raises(HotreloadError, match="chmod 700"):
        ensure_state_dir(mine)
    assert mode(mine) == 0o755
    # What hotreload creates itself is private from the start.
    made = ensure_state_dir(tmp_path / "new" / ".hotreload")
    assert mode(made) == 0o700 and (made / ".gitignore").exists()

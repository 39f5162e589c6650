"""The copy of a version's files a restart falls back to (engine/snapshots.py): taken
before each build, kept while that version serves, removed once another one does or its
build failed."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from hotreload.config import Config, ModelConfig
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.snapshots import Snapshot, SnapshotTooLarge, take_snapshot
from hotreload.paths import ensure_state_dir


async def candidate(
    folder: Path | None,
    config: Config,
    model: ModelConfig,
    version: int,
    ignore: IgnoreRules,
    good: Snapshot | None,
) -> Snapshot | str | None:
    """A snapshot of the files `version` builds from; None: none kept (restarts load the
    files on disk); a string: why it could not be taken."""
    if folder is None:
        return None
    try:
        ensure_state_dir(config.state_dir)
        return await asyncio.to_thread(
            take_snapshot, folder / model.name, model, version, ignore, good
        )
    except (OSError, SnapshotTooLarge) as exc:
        return f"{exc}; a restart will load the files on disk"


def replaced(old: Snapshot | None, new: Snapshot | None) -> Snapshot | None:
    """The snapshot to discard once `new` is the good one (None: keep it)."""
    if old is not None and new is not None and old.folder != new.folder:
        return old
    return None


def is_good(good: Snapshot | None, snapshot: Snapshot | None) -> bool:
    return snapshot is None or (good is not None and good.folder == snapshot.folder)


async def discard(snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        await asyncio.to_thread(remove, snapshot)


def remove(snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        shutil.rmtree(snapshot.folder, ignore_errors=True)


def rewritten_message(good: Snapshot | None, version: int) -> tuple[list[str], str] | None:
    """The files of the last good snapshot rewritten in place since it was taken (large
    files are linked, not copied), and what to say about a restart that loads them."""
    rewritten = good.rewritten() if good else []
    if not rewritten:
        return None
    return [str(p) for p in rewritten], (
        f"{', '.join(p.name for p in rewritten)} rewritten in place since v{version} loaded "
        "(large files are linked, not copied): the restart loads the current contents; save "
        "weights to a new file and rename it over the old to keep a restart on the last "
        "good bytes"
    )

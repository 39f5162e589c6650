"""The copy of a version's files a restart falls back to (engine/snapshots.py): taken
before each build, kept while that version serves, removed once another one does or its
build failed."""

from __future__ import annotations

import asyncio
import shutil
from typing import TYPE_CHECKING

from hotreload.engine.snapshots import Snapshot, SnapshotTooLarge, take_snapshot
from hotreload.paths import ensure_state_dir

if TYPE_CHECKING:
    from hotreload.engine.model.context import Supervisor


async def candidate(sup: Supervisor, version: int) -> Snapshot | None:
    """A snapshot of the files `version` builds from (None: none kept; restarts load the
    files on disk)."""
    if sup.snapshot_dir is None:
        return None
    try:
        ensure_state_dir(sup.config.state_dir)
        return await asyncio.to_thread(
            take_snapshot,
            sup.snapshot_dir / sup.name,
            sup.model,
            version,
            sup.ignore,
            sup.record.good_snapshot,
        )
    except (OSError, SnapshotTooLarge) as exc:
        sup.events.emit(
            "snapshot_skipped",
            model=sup.name,
            reason=f"{exc}; a restart will load the files on disk",
        )
        return None


async def promote(sup: Supervisor, snapshot: Snapshot | None) -> None:
    """`snapshot`'s version serves now: a restart comes back on it."""
    old = sup.set_good_snapshot(snapshot)
    if old is not None and snapshot is not None and old.folder != snapshot.folder:
        await discard(old)  # off the event loop: it relays every request


def is_good(sup: Supervisor, snapshot: Snapshot | None) -> bool:
    good = sup.record.good_snapshot
    return snapshot is None or (good is not None and good.folder == snapshot.folder)


async def discard(snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        await asyncio.to_thread(remove, snapshot)


def remove(snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        shutil.rmtree(snapshot.folder, ignore_errors=True)

"""Is a reload's build the serving version again? Then it is a no-op.

A checkpoint written in two halves fired the watcher twice: the first reload waited for
the whole file (checkpoint_ready.py) and served it, the second rebuilt the very same
weights as one more version. `hotreload reload` twice, or a save without a change, did
the same. A reload whose code and weights are those the serving version was built from
builds nothing: no worker, no version, one history row and one line ("unchanged: nothing
to reload"). `hotreload reload --force` (and the dashboard's reload key) build anyway,
for a model whose build reads something hotreload does not watch.

What "the same" means, cheaply and never wrongly the same:

- the snapshot taken for this reload holds the same files as the serving version's
  snapshot, each with the same stamp (file_stamp.py), or, for a copied (small) file whose
  stamp moved, the same bytes in both copies: a save without a change of a code file;
- every weights file has the stamp the serving build found (its `weights_stat`), or, when
  no push lies over them and the checkpoint is small (MAX_COMPARE_BYTES in all), the same
  sha256 as the bytes that version read (hashed once it served, `weights_sha`): a save of
  the same weights again. A bigger checkpoint saved again builds: hashing it would cost
  what the load costs;
- a watcher's reload that names a changed file neither snapshot holds builds: that file
  is something the comparison does not see.
"""

from __future__ import annotations

import asyncio
import filecmp
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.file_stamp import FileStamp
from hotreload.engine.model.jobs import ReloadOutcome
from hotreload.engine.model.pushes import files_signature
from hotreload.engine.snapshots import Snapshot

#: What the no-change line says, in the history row and the log.
UNCHANGED = "unchanged: nothing to reload"
#: Copies whose stamps moved are compared byte for byte up to this much in all; past it
#: the reload builds (a compare must not cost what a load costs).
MAX_COMPARE_BYTES = 64 * 2**20


def _same_files(serving: Snapshot, candidate: Snapshot) -> bool:
    if set(serving.sources) != set(candidate.sources):
        return False  # a file added or removed
    budget = MAX_COMPARE_BYTES
    for path, stamp in candidate.sources.items():
        if serving.sources[path] == stamp:
            continue
        if path in serving.linked or path in candidate.linked:
            return False  # a linked copy is the live file itself: its stamp is all we have
        budget -= stamp.size
        if budget < 0:
            return False
        if not filecmp.cmp(serving.remap(path), candidate.remap(path), shallow=False):
            return False
    return True


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


#: (stamp, sha256) of each weights file, as `weights_sha` found them.
WeightsSha = tuple[tuple[Any, str | None], ...]


def weights_sha(
    model: ModelConfig, stat: tuple[Any, ...] | None, known: WeightsSha | None
) -> WeightsSha | None:
    """The sha256 of each weights file whose stamp is still `stat`'s (the bytes the serving
    version read); None for a file that moved, and for all of a checkpoint past the budget.
    A file whose stamp `known` (the last version's) hashed already is not read again: a
    code edit hashes nothing. Run on a thread once a version serves."""
    if not model.weights or stat is None or len(stat) != len(model.weights):
        return None
    if sum(s.size for s in stat if s is not None) > MAX_COMPARE_BYTES:
        return None
    before = {stamp: sha for stamp, sha in known or () if stamp is not None and sha}
    out: list[tuple[Any, str | None]] = []
    for path, seen in zip(model.weights, stat, strict=True):
        digest = before.get(seen) if seen is not None else None
        if digest is None and seen is not None:
            try:
                digest = _sha256(path)
            except OSError:
                digest = None
            digest = digest if FileStamp.of(path) == seen else None
        out.append((seen, digest))
    return tuple(out)


def _same_weights(model: ModelConfig, record: Any) -> bool:
    """Every weights file holds the bytes the serving version read (by stamp, or by sha256
    for a small checkpoint saved again), and no push lies over them."""
    now, seen, shas = files_signature(model), record.weights_stat, record.weights_sha
    if seen is None or now == seen:
        return True
    if record.overlays or shas is None or len(now) != len(seen):
        return False  # a save over pushed weights goes back to the files: it builds
    if sum(s.size for s in now if s is not None) > MAX_COMPARE_BYTES:
        return False
    for path, a, b, (_, sha) in zip(model.weights, now, seen, shas, strict=True):
        if a == b:
            continue
        try:
            if a is None or sha is None or _sha256(path) != sha:
                return False
        except OSError:
            return False
    return True


def _named_elsewhere(
    trigger: str, detail: Sequence[str], root: Path, snaps: Sequence[Snapshot]
) -> str | None:
    """A changed file the watcher named that no snapshot holds (None: none)."""
    if "file" not in trigger.split("+"):
        return None
    held = {p for s in snaps for p in s.sources}
    for shown in detail:
        path = Path(shown) if Path(shown).is_absolute() else root / shown
        if path not in held and path.resolve() not in held:
            return shown
    return None


async def check(
    outcome: ReloadOutcome, model: ModelConfig, root: Path, record: Any, candidate: Any
) -> None:
    """Mark `outcome` unchanged (with the line saying so) when the reload would build the
    serving version again; leave it alone to build. `record`: the model's ModelRecord,
    `candidate`: the snapshot taken for this reload (None: none)."""
    serving = record.good_snapshot
    if serving is None or candidate is None or record.current is None:
        return  # nothing to compare with: build, as before
    if not await asyncio.to_thread(_same_weights, model, record):
        return
    if _named_elsewhere(outcome.trigger, outcome.detail, root, (serving, candidate)):
        return
    if not await asyncio.to_thread(_same_files, serving, candidate):
        return
    outcome.unchanged = True
    outcome.detail.append(
        f"{UNCHANGED}: code and weights are those v{record.version} serves "
        "(hotreload reload --force builds it again)"
    )

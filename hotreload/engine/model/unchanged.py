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
- every weights file has the stamp the serving build found (its `weights_stat`): a
  weights file is never hashed here, a rewrite of it always builds;
- a watcher's reload that names a changed file neither snapshot holds builds: that file
  is something the comparison does not see.
"""

from __future__ import annotations

import asyncio
import filecmp
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotreload.config import ModelConfig
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
    if record.weights_stat is not None and files_signature(model) != record.weights_stat:
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

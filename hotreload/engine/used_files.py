"""What a model uses: the files whose edit reloads it.

A model reloads when a file its serving version imported changes (the worker names them
after each build: `LoadReply.imports`, only files in the model's code folders), one of its
weights files (`ModelConfig.weight_files`), its entry or example file, or any file under a
`watch` path the config lists itself (what the import graph cannot see: data read at build
time). So two models in one folder reload each other only when one imports the other's
code, and a client script saved beside them reloads nothing.

A model with no version loaded yet has no import list: every file under its watch paths
reloads it. A failed build keeps the last good list and adds the files it tried to import
(`ModelRecord.tried_imports`): saving the fix of a new module that did not compile reloads
the model.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from hotreload.config import ModelConfig


class _Record(Protocol):
    """What is read of a model's record (engine/model/record.py `ModelRecord`): the reload
    core imports this module, so it is not imported back."""

    current: Any
    tried_imports: tuple[str, ...]
    good_snapshot: Any


def watch_roots(model: ModelConfig) -> tuple[Path, ...]:
    """Where the model's files are looked for: its `watch` paths, and the folders its code
    is imported from whatever `watch` lists (the entry's, as the worker's code roots, and
    the example's file). Only the files it uses reload it there (`Routes`)."""
    roots = list(model.watch)
    for extra in (model.entry.file and model.entry.file.parent, model.example.file):
        if extra is not None and not under(extra, roots):
            roots.append(extra)
    return tuple(roots)


#: What Hugging Face writes beside a checkpoint and `build()` reads with it
#: (`from_pretrained`, `AutoConfig.from_pretrained`): the model's own config.
BESIDE_WEIGHTS = ("config.json", "generation_config.json")


def always_used(model: ModelConfig) -> frozenset[Path]:
    """Files a model uses whatever it imports: its entry and example files, and the
    config files beside its weights (an edit of one is a full reload: build() reads it)."""
    files = {p for p in (model.entry.file, model.example.file) if p is not None}
    files.update(w.parent / name for w in model.weight_files for name in BESIDE_WEIGHTS)
    return frozenset(files)


def used_folders(model: ModelConfig) -> tuple[Path, ...]:
    """Folders every file of which the model uses: the `watch` paths the config lists
    (what the import graph cannot see) and its tokenizer's folder."""
    return (*model.watch_listed, *((model.tokenizer,) if model.tokenizer else ()))


def tried_imports(exc: BaseException) -> tuple[str, ...]:
    """The files a failed build imported or tried to, from the worker's error reply
    (`WorkerReplyError.imports`) anywhere along the chain of exceptions that wrap it."""
    seen: set[int] = set()
    found: list[str] = []
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        found.extend(getattr(cur, "imports", ()) or ())
        cur = cur.__cause__ or cur.__context__
    return tuple(found)


def files_used(model: ModelConfig, record: _Record) -> frozenset[Path] | None:
    """The files whose edit reloads `model` beside its declared ones and its listed `watch`
    paths: what its serving version imported, what failed builds since tried to, its entry
    and example. None while no version has loaded (every file in its folders reloads it)."""
    current = record.current
    if current is None:
        return None
    snapshot = record.good_snapshot
    copies = tuple(snapshot.roots) if snapshot is not None else ()
    return _live_files((*current.imports, *record.tried_imports), copies) | always_used(model)


@functools.lru_cache(maxsize=64)
def _live_files(files: tuple[str, ...], copies: tuple[tuple[Path, Path], ...]) -> frozenset[Path]:
    """`files` as the watcher sees them: resolved (the config's paths are), and a worker
    restarted on the last good snapshot named copies there, which stand for the live files.
    Cached: asked on every file event, and the lists change only with a new version."""
    out = set()
    for f in files:
        path = Path(os.path.abspath(f))
        for live, copy in copies:
            if path == copy or copy in path.parents:
                path = live / path.relative_to(copy) if path != copy else live
                break
        out.add(path.resolve())
    return frozenset(out)


def under(path: Path, roots: Iterable[Path]) -> bool:
    """`path` is one of `roots` or inside one."""
    return any(path == r or r in path.parents for r in roots)

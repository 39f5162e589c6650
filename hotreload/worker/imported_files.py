"""Which of the project's files a build imported, told to the manager in the LOAD reply.

The manager's watcher reloads a model when a file it imported changes, not on every save in
its folder. After a build, every module in `sys.modules` whose file lies in the model's code
folders was imported by this version (the reload dropped the previous version's first). A
failed build is told too, with the files it tried to compile (`SourceOnlyLoader` notes each
before compiling it, so the file with the syntax error is among them): saving the fix
reloads the model. Installed packages and the standard library are never reported.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hotreload.worker.fresh_source import compiled, folder_prefixes, in_project, loaded_files

#: Set on the exception of a failed build: the files it imported or tried to.
_ATTR = "_hotreload_imported_files"
#: The last scan of sys.modules: (its length, the prefixes, the project files found).
_last: tuple[int, tuple[str, ...], frozenset[str]] = (-1, (), frozenset())


@contextlib.contextmanager
def tracking(roots: Sequence[Path], *, reimported: bool = True) -> Iterator[None]:
    """Around a build: what earlier builds compiled is not this one's, and an exception
    leaving it carries the files this one imported or tried to (`failure_fields`).
    `reimported`: the user's modules were dropped for this build. A push runs the serving
    code again (none dropped), so the last scan of sys.modules stands: with transformers
    loaded the scan was a third of a tiny model's push (about 30 ms of ~90)."""
    global _last
    compiled.clear()
    if reimported:
        _last = (-1, (), frozenset())  # the modules were dropped and imported again since
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(AttributeError, TypeError):
            setattr(exc, _ATTR, imported_files(roots))
        raise


def failure_fields(exc: BaseException) -> dict[str, Any]:
    """The error reply's `imports` field, for the exception of a failed build (else none)."""
    files = getattr(exc, _ATTR, None)
    return {} if files is None else {"imports": files}


def imported_files(roots: Sequence[Path]) -> list[str]:
    """The files under `roots` that the loaded modules (and the build's compiles) came from."""
    global _last
    prefixes = folder_prefixes(roots)
    found = {p for p in list(compiled) if in_project(p, prefixes)}
    count, seen_prefixes, modules = _last
    if count != len(sys.modules) or seen_prefixes != prefixes:
        # A few ms: the smoke test's ask, after the load's, scans again only when something
        # was imported in between.
        modules = frozenset(f for _, _, f in loaded_files() if in_project(f, prefixes))
        _last = (len(sys.modules), prefixes, modules)
    return sorted(found | modules)


#: What the worker had imported when this module was (torch, numpy, hotreload's own).
_AT_START = frozenset(sys.modules)
#: `libraries` stays small enough for the spec of the standby's environment.
MAX_LIBRARY_CHARS = 48_000


def libraries() -> list[str]:
    """Installed modules imported since the worker started, in import order (sys.modules
    keeps it), for a fresh standby to import ahead of time (engine/model/standby.py): a
    Hugging Face model's first build in a new process spent seconds importing transformers."""
    out: list[str] = []
    size = 0
    for name, _, file in loaded_files():
        if name in _AT_START or name.startswith("__"):
            continue
        if "site-packages" not in file and "dist-packages" not in file:
            continue
        size += len(name) + 3
        if size > MAX_LIBRARY_CHARS:
            break
        out.append(name)
    return out

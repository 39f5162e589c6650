"""Import the user's code from its source every time, never from a cached .pyc.

A .pyc is trusted when the source's mtime, in whole seconds, and its size match what the
.pyc recorded. An edit saved within the same second as the last import that keeps the
file's length (`SCALE = 2.0` -> `SCALE = 3.0`) therefore re-imports the *old* code, and a
reload would silently serve the previous version. Only modules under the model's code
folders go through here; every other import (torch, site-packages) keeps its .pyc.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any


def code_roots(spec: Mapping[str, Any]) -> list[Path]:
    """The folders the user's code lives in: the watched ones and the entry file's."""
    roots = [Path(p) for p in spec.get("watch", [])]
    entry_file = spec["entry"].get("file")
    if entry_file:
        roots.append(Path(entry_file).parent)
    return roots


def folder_prefixes(roots: Sequence[Path]) -> tuple[str, ...]:
    """Each folder as its absolute and its resolved path, with a trailing separator: a path
    is inside one when it starts with any of them (a string test, no resolve() per path)."""
    return tuple(
        {os.path.join(os.path.abspath(r), "") for r in roots}
        | {os.path.join(os.path.realpath(r), "") for r in roots}
    )


#: Source files compiled since the build began (worker/imported_files.py tells the manager).
compiled: set[str] = set()


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles from the source file on every import and writes no .pyc."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        compiled.add(path)  # even when it does not compile: the fix must reload the model
        return self.source_to_code(self.get_data(path), path)


class UserCodeFinder(importlib.abc.MetaPathFinder):
    """On sys.meta_path just ahead of the path finder (built-in and frozen modules still
    come first): finds modules the normal way, inside the code folders only, and gives
    those found there a SourceOnlyLoader."""

    def __init__(self) -> None:
        self.prefixes: tuple[str, ...] = ()
        # Installed packages keep their .pyc even inside a code folder (a project's .venv).
        self.installed = tuple(
            {os.path.join(os.path.abspath(p), "") for p in (sys.prefix, sys.base_prefix)}
        )

    def set_roots(self, roots: Sequence[Path]) -> None:
        self.prefixes = folder_prefixes(roots)

    def _inside(self, path: str) -> bool:
        folder = os.path.join(os.path.abspath(path or "."), "")
        if "site-packages" in folder or "dist-packages" in folder:
            return False
        return folder.startswith(self.prefixes) and not folder.startswith(self.installed)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not self.prefixes:
            return None
        # Search only where Python itself would, restricted to entries in the code folders:
        # a top-level name along sys.path, a submodule along its package's __path__.
        entries = list(sys.path if path is None else path)
        search = [p for p in entries if self._inside(p)]
        if not search:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, search, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return None  # not found there, or not plain source: the usual finders decide
        earlier = entries[: entries.index(search[0])]
        if earlier and importlib.machinery.PathFinder.find_spec(fullname, earlier, target):
            return None  # an entry ahead of the code folders wins, as it would anyway
        assert spec.origin is not None
        spec.loader = SourceOnlyLoader(fullname, spec.origin)
        return spec


_finder = UserCodeFinder()


def compile_from_source(roots: Sequence[Path]) -> None:
    """From now on, modules imported from inside `roots` are compiled from their source."""
    _finder.set_roots(roots)
    if _finder not in sys.meta_path:
        at = next(
            (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
            len(sys.meta_path),
        )
        sys.meta_path.insert(at, _finder)

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
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, ModuleType


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles from the source file on every import and writes no .pyc."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class UserCodeFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: finds modules the normal way, inside the code folders only,
    and gives those found there a SourceOnlyLoader."""

    def __init__(self) -> None:
        self.prefixes: tuple[str, ...] = ()

    def set_roots(self, roots: Sequence[Path]) -> None:
        self.prefixes = tuple(
            {os.path.join(os.path.abspath(r), "") for r in roots}
            | {os.path.join(os.path.realpath(r), "") for r in roots}
        )

    def _inside(self, path: str) -> bool:
        return os.path.join(os.path.abspath(path or "."), "").startswith(self.prefixes)

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
        search = [p for p in (sys.path if path is None else path) if self._inside(p)]
        if not search:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, search, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return None  # not found there, or not plain source: the usual finders decide
        assert spec.origin is not None
        spec.loader = SourceOnlyLoader(fullname, spec.origin)
        return spec


_finder = UserCodeFinder()


def compile_from_source(roots: Sequence[Path]) -> None:
    """From now on, modules imported from inside `roots` are compiled from their source."""
    _finder.set_roots(roots)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

"""Import the user's code from its source every time, never from a cached .pyc.

A .pyc is trusted when the source's mtime, in whole seconds, and its size match what it
recorded: an edit saved within the second of the last import that keeps the file's length
(`SCALE = 2.0` -> `SCALE = 3.0`) would re-import the old code. Only modules under the
model's code folders go through here; every other import keeps its .pyc.

The bytes compiled are those of the build's snapshot (engine/snapshots.py) where it copied
the file: an edit saved after the snapshot goes to the next reload (the watcher saw it),
not into this version beside a snapshot that says otherwise. The code keeps the live file's
name (tracebacks, `__file__`, data read beside it), and linecache gets the lines compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
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


#: Installed packages are never the project's, even inside a code folder (a project's .venv).
_INSTALLED = tuple({os.path.join(os.path.abspath(p), "") for p in (sys.prefix, sys.base_prefix)})


def in_project(path: str, prefixes: tuple[str, ...]) -> bool:
    """Is the absolute `path` inside the code folders (`prefixes`), and no installed file?"""
    if "site-packages" in path or "dist-packages" in path:
        return False
    return path.startswith(prefixes) and not path.startswith(_INSTALLED)


def loaded_files() -> Iterator[tuple[str, ModuleType, str]]:
    """(name, module, absolute file) of each loaded module with a file (not a built-in,
    frozen or namespace one). Runs over ~1,200 modules once torch is in: no abspath where
    the file is absolute already (nearly always)."""
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if file:
            yield name, mod, file if os.path.isabs(file) else os.path.abspath(file)


#: Source files compiled since the build began (worker/imported_files.py tells the manager).
compiled: set[str] = set()
#: Each source file compiled in this process -> the digest of the bytes compiled last: a
#: build that keeps the loaded modules asks whether they are still the code (`stale`).
compiled_from: dict[str, str] = {}
#: (live root, its copy in the build's snapshot), as absolute paths with a trailing
#: separator (a root that is a file: without); empty: the live files are compiled.
_copies: tuple[tuple[str, str], ...] = ()


def read_from(copies: Sequence[Sequence[str]]) -> None:
    """From now on a source file inside one of `copies`' live roots is read from its copy
    there (the snapshot this build was given), when the copy exists."""
    global _copies
    out: list[tuple[str, str]] = []
    for live, copy in copies:
        is_dir = os.path.isdir(copy)
        for form in dict.fromkeys((os.path.abspath(live), os.path.realpath(live))):
            out.append((os.path.join(form, ""), os.path.join(copy, "")) if is_dir else (form, copy))
    _copies = tuple(out)


def source_path(path: str) -> str:
    """Where the source of `path` is read from: its snapshot copy, or the live file."""
    for live, copy in _copies:
        if path == live or (live.endswith(os.sep) and path.startswith(live)):
            mapped = copy + path[len(live) :] if live.endswith(os.sep) else copy
            if os.path.isfile(mapped):
                return mapped
    return path


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def stale(paths: Sequence[str]) -> list[str]:
    """Those of `paths` whose source (`source_path`) no longer holds the bytes compiled
    last, or was never compiled here, or cannot be read."""
    out = []
    for path in paths:
        try:
            with open(source_path(path), "rb") as f:
                now = _digest(f.read())
        except OSError:
            now = None
        if now is None or compiled_from.get(path) != now:
            out.append(path)
    return out


def stale_modules(roots: Sequence[Path], gone: Sequence[Path] = ()) -> list[str]:
    """The user's modules that are not the code a build is to run now: one compiled from
    other bytes than its source (`source_path`) holds now (a failed build imported an edit
    since undone, or the file was saved again), and any module under `gone` (code paths the
    worker no longer loads from: the snapshot it restarted on)."""
    inside, left = folder_prefixes(roots), folder_prefixes(gone) if gone else ()
    out: list[str] = []
    files: dict[str, str] = {}
    for name, mod, file in loaded_files():
        if "site-packages" in file:
            continue
        if left and file.startswith(left):
            out.append(name)
        loader = getattr(getattr(mod, "__spec__", None), "loader", None)
        if file.startswith(inside) and isinstance(loader, SourceOnlyLoader):
            files[loader.path] = name  # not an extension module, nor a .pyc
    return out + [files[path] for path in stale(list(files))]


def must_reimport(request: Any, roots: Sequence[Path], old: Sequence[Path]) -> bool:
    """Does a LOAD (`request`: protocol/messages.py LoadRequest) drop the user's modules to
    import them again? When it says so, and when it is a reload's build (it names the code:
    the files) whose loaded modules are not the code on disk when it started
    (`stale_modules`): the code a version runs is that code, whatever an earlier build left
    imported."""
    if request.reimport:
        return True
    gone = [r for r in old if r not in roots]
    return bool(request.code) and bool(stale_modules(roots, gone))


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles from the source (the snapshot's copy where there is one) on every import
    and writes no .pyc."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        compiled.add(path)  # even when it does not compile: the fix must reload the model
        data = self.get_data(source_path(path))
        compiled_from[path] = _digest(data)
        # A traceback or inspect.getsource shows the lines compiled, not the file's newer
        # ones (an mtime of None: linecache.checkcache keeps the entry).
        try:
            lines = importlib.util.decode_source(data).splitlines(keepends=True)
        except (SyntaxError, UnicodeDecodeError, LookupError):
            lines = []  # compiling it says what is wrong
        if lines:
            linecache.cache[path] = (len(data), None, lines, path)
        return self.source_to_code(data, path)


class UserCodeFinder(importlib.abc.MetaPathFinder):
    """On sys.meta_path just ahead of the path finder (built-in and frozen modules still
    come first): finds modules the normal way, inside the code folders only, and gives
    those found there a SourceOnlyLoader."""

    prefixes: tuple[str, ...] = ()

    def set_roots(self, roots: Sequence[Path]) -> None:
        self.prefixes = folder_prefixes(roots)

    def _inside(self, path: str) -> bool:
        return in_project(os.path.join(os.path.abspath(path or "."), ""), self.prefixes)

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


def compile_from_source(roots: Sequence[Path], copies: Sequence[Sequence[str]] = ()) -> None:
    """From now on, modules imported from inside `roots` are compiled from their source,
    read from `copies` (live root, copy: the build's snapshot) where they hold the file."""
    _finder.set_roots(roots)
    read_from(copies)
    if _finder not in sys.meta_path:
        at = next(
            (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
            len(sys.meta_path),
        )
        sys.meta_path.insert(at, _finder)

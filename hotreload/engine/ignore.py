"""Which files never trigger a reload: VCS and cache folders, editor temp and swap files,
the tool's own state folder, logs, and the user's own globs.

Editors save in odd ways (vim's `4913` probe, JetBrains' `___jb_tmp___` safe-write files,
Emacs' `.#lock` links and `#autosave#` files); logs and checkpoints written inside the
watched tree would cause reload storms.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePath

#: Folder names skipped anywhere in a path.
IGNORED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".hotreload",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "node_modules",
        "wandb",
        "lightning_logs",
    }
)
#: File-name globs skipped anywhere.
IGNORED_FILES = (
    "*.pyc",
    "*.pyo",
    "*.swp",
    "*.swx",
    "*.swo",
    "*~",
    ".#*",
    "#*#",
    "4913",
    "*___jb_tmp___",
    "*___jb_old___",
    "*.tmp",
    ".*.tmp",
    # safetensors' save_file writes `.tmpXXXXXX` beside the target, then renames it.
    ".tmp*",
    "*.log",
    ".DS_Store",
)


class IgnoreRules:
    """Default rules plus configured globs (matched against the path relative to a root,
    and against the file name)."""

    def __init__(self, extra_globs: Iterable[str] = (), extra_dirs: Iterable[Path] = ()) -> None:
        self.globs = tuple(extra_globs)
        self.dirs = tuple(p.resolve() for p in extra_dirs)

    def ignored(self, path: Path, root: Path | None = None) -> bool:
        parts = path.parts
        if any(part in IGNORED_DIRS for part in parts[:-1]):
            return True
        name = path.name
        if name in IGNORED_DIRS or any(fnmatch.fnmatchcase(name, g) for g in IGNORED_FILES):
            return True
        if any(d == path or d in path.parents for d in self.dirs):
            return True
        if self.globs:
            inside = root is not None and path.is_relative_to(root)
            text = (path.relative_to(root) if inside else PurePath(name)).as_posix()
            for g in self.globs:
                if fnmatch.fnmatchcase(text, g) or fnmatch.fnmatchcase(name, g):
                    return True
                # "data/**" also covers the folder's contents at any depth.
                if g.endswith("/**") and (text == g[:-3] or text.startswith(g[:-2])):
                    return True
        return False

    def files_under(
        self, root: Path, onerror: Callable[[OSError], None] | None = None
    ) -> Iterator[Path]:
        """The files under folder `root` that are not ignored; an ignored folder is not
        entered (it is ignored as a file in it would be)."""
        for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
            here = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not self.ignored(here / d / "x", root)]
            yield from (here / n for n in filenames if not self.ignored(here / n, root))

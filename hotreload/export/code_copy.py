"""The user's code and weights, copied into an exported model's version folder.

File entries (`model.py:build`): the folder holding the entry and example files is copied
(their data files and the sibling modules they import come along; Python files nothing
imports, such as a client script, are left out) as `1/code/`. Module entries
(`pkg.model:build`): the top-level package found under the project root is copied into
`1/code/`; one found nowhere there is an installed package, which Triton's Python must
have too. Weights outside the copied folder go to `1/weights/`.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.config import Config, EntryPoint, ModelConfig
from hotreload.export.imports_closure import unimported_files

#: Folders never copied: tools' caches, environments, hotreload's own state.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        "__pycache__",
        ".hotreload",
        ".venv",
        "venv",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
    }
)
#: A folder larger than this is refused: the entry sits in a project root holding data.
MAX_CODE_BYTES = 4 * 2**30


class CopyError(Exception):
    """The code or weights cannot be copied as they are; the message says what to change."""


@dataclass
class CodeCopy:
    """What was copied into one version folder."""

    #: Entry points as the exported model.py reads them (files relative to `code/`).
    entry: dict[str, Any]
    example: dict[str, Any]
    #: Weights files relative to the version folder, in the config's order.
    weights: list[str]
    files: int = 0
    nbytes: int = 0
    #: Where the code came from (for the summary).
    sources: list[str] = field(default_factory=list)
    #: Packages imported by the code that Triton's Python needs (name -> version here).
    requires: dict[str, str] = field(default_factory=dict)
    #: Module entries found nowhere under the project root (installed packages).
    installed: list[str] = field(default_factory=list)
    #: Copied files that import hotreload (a client script, say), relative to code/.
    hotreload_importers: list[str] = field(default_factory=list)
    #: Python files of the code folder that the model never imports (left out of code/).
    left_out: list[str] = field(default_factory=list)


def _ignore(skip: Iterable[Path]) -> Any:
    skip_resolved = {p.resolve() for p in skip}

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        return {
            n
            for n in names
            if n in SKIP_DIRS or (here / n).resolve() in skip_resolved or n.endswith(".pyc")
        }

    return ignore


def _size(folder: Path, ignore: Any) -> tuple[int, int]:
    files = nbytes = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dropped = ignore(dirpath, dirnames + filenames)
        dirnames[:] = [d for d in dirnames if d not in dropped]
        for f in filenames:
            if f not in dropped:
                files += 1
                nbytes += os.path.getsize(os.path.join(dirpath, f))
    return files, nbytes


def _copy_tree(src: Path, dst: Path, skip: Iterable[Path], out: CodeCopy) -> None:
    ignore = _ignore(skip)
    files, nbytes = _size(src, ignore)
    if nbytes > MAX_CODE_BYTES:
        raise CopyError(
            f"{src} holds {nbytes / 2**30:.1f} GiB ({files} files): too much to copy as the "
            "model's code; move the model's code into a folder of its own (entry = "
            '"model/model.py:build") or list large data in `weights`'
        )
    shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
    out.files += files
    out.nbytes += nbytes
    out.sources.append(str(src))


def _module_origin(module: str, root: Path) -> Path | None:
    """The file or package folder of `module`'s top-level package under `root`, found
    without importing anything."""
    top = module.split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [str(root)])
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin else None


def copy_code(config: Config, model: ModelConfig, version_dir: Path, skip: list[Path]) -> CodeCopy:
    """Copy `model`'s code and weights into `version_dir` (code/ and weights/)."""
    code = version_dir / "code"
    code.mkdir(parents=True)
    entries: list[EntryPoint] = [model.entry, model.example]
    files = [e.file for e in entries if e.file is not None]
    base = Path(os.path.commonpath([str(f.parent) for f in files])) if files else None
    out = CodeCopy(entry={}, example={}, weights=[])
    if base is not None:
        _copy_tree(base, code, skip, out)
        # Only what the model imports: a client script beside model.py is not the model's,
        # and its imports are no requirement of Triton's Python (imports_closure.py).
        for rel in unimported_files(base, files):
            copied = code / rel
            if copied.is_file():
                out.files -= 1
                out.nbytes -= copied.stat().st_size
                copied.unlink()
                out.left_out.append(rel.as_posix())
    for e in entries:
        if e.module is None:
            continue
        origin = _module_origin(e.module, config.root)
        if origin is None:
            out.installed.append(e.module)
        elif str(origin) not in out.sources:
            target = code / origin.name
            if target.exists() and base is None:
                raise CopyError(f"{origin.name} is both a module entry and a copied file")
            if origin.is_dir():
                _copy_tree(origin, target, skip, out)
            elif not target.exists():
                shutil.copy2(origin, target)
                out.files += 1
                out.sources.append(str(origin))
    for key, e in (("entry", model.entry), ("example", model.example)):
        wire = e.to_wire()
        if e.file is not None and base is not None:
            wire["file"] = e.file.relative_to(base).as_posix()
        setattr(out, key, wire)
    for i, w in enumerate(model.weights):
        if base is not None and w.is_relative_to(base) and not _skipped(w, base):
            out.weights.append("code/" + w.relative_to(base).as_posix())
            continue
        dest = version_dir / "weights" / (f"{i}_{w.name}" if i else w.name)
        dest.parent.mkdir(exist_ok=True)
        shutil.copy2(w, dest)
        out.weights.append(dest.relative_to(version_dir).as_posix())
    out.requires, out.hotreload_importers = third_party_imports(code)
    return out


def _skipped(path: Path, base: Path) -> bool:
    return any(part in SKIP_DIRS for part in path.relative_to(base).parts[:-1])


def _local_names(code: Path) -> set[str]:
    names = set()
    for p in code.rglob("*"):
        if p.suffix == ".py":
            names.add(p.stem)
        elif p.is_dir():
            names.add(p.name)
    return names


def third_party_imports(code: Path) -> tuple[dict[str, str], list[str]]:
    """Distributions the copied code imports (name -> version installed here), found by
    reading its imports: everything not in the standard library and not copied along; and
    the files that import hotreload (kept apart: the exported model never needs it, unless
    the model's own code imports it)."""
    local = _local_names(code)
    tops: set[str] = set()
    importers: list[str] = []
    for path in sorted(code.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue  # the build itself would have failed on a file it uses
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops.add(node.module.split(".")[0])
        if "hotreload" in tops:
            importers.append(path.relative_to(code).as_posix())
            tops.discard("hotreload")
    tops -= set(sys.stdlib_module_names) | local | {"__future__"}
    dists = importlib.metadata.packages_distributions()
    out: dict[str, str] = {}
    for top in sorted(tops):
        for dist in dists.get(top, [top]):
            try:
                out[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                out[dist] = "not installed here"
    return out, importers

"""Copies of a model's last good code and weights, so a worker that must be restarted (it
died, or wedged) comes back with the version that was serving, not with a broken edit that
is now on disk.

Small files are copied; large ones (weights) are hard-linked where the file system allows,
which keeps the old bytes when tools replace the file, as torch.save and safetensors do.
A file unchanged since the previous snapshot (same size and modification time, which the
copy keeps, and already that old when it was taken) is hard-linked to that copy: a reload
that changed one line copies one file.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.ignore import IgnoreRules

#: Above this a file is hard-linked instead of copied (when possible).
LINK_ABOVE_BYTES = 8 * 2**20
#: A file is reused from the previous snapshot only if it was last written this long before
#: that snapshot: file times tick coarsely (a few ms), so a same-size rewrite right after
#: the copy could otherwise keep the same time.
SETTLED_NS = 100_000_000
#: A snapshot that would copy more than this is skipped (the restart then uses the disk).
MAX_COPY_BYTES = 512 * 2**20


class SnapshotTooLarge(Exception):
    pass


@dataclass(frozen=True)
class Snapshot:
    version: int
    folder: Path
    #: Live root -> its copy.
    roots: tuple[tuple[Path, Path], ...]
    #: Live weights file -> its copy.
    weights: tuple[tuple[Path, Path], ...]
    #: When it was taken (time.time_ns(), the clock file times use).
    taken_ns: int = 0

    def remap(self, path: Path) -> Path:
        for live, copy in self.weights:
            if path == live:
                return copy
        for live, copy in self.roots:
            if path == live:
                return copy
            if live in path.parents:
                return copy / path.relative_to(live)
        return path


def code_paths(
    model: ModelConfig, project_root: Path, snapshot: Snapshot | None = None
) -> dict[str, Any]:
    """The path fields of a worker spec, live or remapped into a snapshot."""

    def m(p: Path) -> Path:
        return snapshot.remap(p) if snapshot else p

    def entry(e: Any) -> dict[str, Any]:
        wire = e.to_wire()
        if e.file is not None:
            wire["file"] = str(m(e.file))
        return wire

    return {
        "root": str(m(project_root.resolve())),
        "entry": entry(model.entry),
        "example": entry(model.example),
        "weights": [str(m(p)) for p in model.weights],
        "watch": [str(m(p)) for p in model.watch],
    }


def _place(
    src: Path, dst: Path, budget: list[int], previous: Path | None = None, settled_ns: int = 0
) -> None:
    """Copy (or link) `src` to `dst`; `previous`: its copy in the last snapshot, reused when
    the file was last written before `settled_ns` and has not changed since."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    st = src.stat()
    size = st.st_size
    if previous is not None and previous != src and st.st_mtime_ns < settled_ns:
        try:
            old = previous.stat()
            if (old.st_size, old.st_mtime_ns) == (size, st.st_mtime_ns):
                os.link(previous, dst)  # our own copy, never written to: share it
                return
        except OSError:
            pass  # gone, or no hard links here: copy
    if size > LINK_ABOVE_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    budget[0] += size
    if budget[0] > MAX_COPY_BYTES:
        raise SnapshotTooLarge(
            f"the model's folders hold more than {MAX_COPY_BYTES // 2**20} MiB to copy; "
            "narrow `watch` or add `ignore` globs"
        )
    shutil.copy2(src, dst)


def take_snapshot(
    base: Path,
    model: ModelConfig,
    version: int,
    rules: IgnoreRules,
    previous: Snapshot | None = None,
) -> Snapshot:
    """Copy the model's watch roots and weights into base/vN (blocking: run in a thread);
    files unchanged since `previous` are linked to its copies."""
    taken_ns = time.time_ns()
    settled_ns = previous.taken_ns - SETTLED_NS if previous is not None else 0
    budget = [0]

    def place(src: Path, dst: Path) -> None:
        before = previous.remap(src) if previous is not None else None
        _place(src, dst, budget, before, settled_ns)

    folder = base / f"v{version}"
    if folder.exists():
        shutil.rmtree(folder)
    roots: list[tuple[Path, Path]] = []
    try:
        for i, root in enumerate(model.watch):
            copy = folder / f"r{i}"
            roots.append((root, copy))
            if root.is_file():
                place(root, copy)
                continue
            for dirpath, dirnames, filenames in os.walk(root):
                here = Path(dirpath)
                dirnames[:] = [d for d in dirnames if not rules.ignored(here / d / "x", root)]
                for name in filenames:
                    src = here / name
                    if rules.ignored(src, root) or not src.is_file():
                        continue
                    place(src, copy / src.relative_to(root))
        weights: list[tuple[Path, Path]] = []
        for j, w in enumerate(model.weights):
            copy = folder / "weights" / f"{j}-{w.name}"
            place(w, copy)
            weights.append((w, copy))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Snapshot(version, folder, tuple(roots), tuple(weights), taken_ns)

"""Copies of a model's last good code, weights and peft adapter folders, so a worker that
must be restarted (it died, or wedged) comes back with the version that was serving, not
with a broken edit (or an adapter file cut short) that is now on disk.

Small files are copied; large ones (weights) are hard-linked where the file system allows.
A link keeps the old bytes only when the tool that saves the file writes a new one and
renames it over the old (an atomic save); one that rewrites the file in place (`torch.save`
to the same path does) changes the linked bytes too. A restart checks for that
(`Snapshot.rewritten`) and says so.

A file unchanged since the previous snapshot (same inode, size, modification and change
times, and settled: last changed well before that snapshot) is hard-linked to the copy
there, which is ours and never written to: a reload that changed one line copies one file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.file_stamp import FileStamp
from hotreload.engine.ignore import IgnoreRules

#: Above this a file is hard-linked instead of copied (when possible).
LINK_ABOVE_BYTES = 8 * 2**20
#: A file is reused from the previous snapshot only if it last changed this long before that
#: snapshot: file times tick coarsely (a few ms here, 1 to 2 s on FAT, SMB or some network
#: mounts), so a same-size rewrite right after the copy could otherwise keep every time.
SETTLED_NS = 3_000_000_000
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
    #: Live file -> its stamp when copied.
    sources: Mapping[Path, FileStamp] = field(default_factory=dict)
    #: Large live files linked, not copied -> their stamp when linked.
    linked: Mapping[Path, FileStamp] = field(default_factory=dict)

    def rewritten(self) -> list[Path]:
        """Linked files rewritten in place since: the bytes here are the new ones. (A file
        replaced by a rename left the link, and its old bytes, alone. A link that is gone
        counts too: nothing of the old bytes is left.)"""
        return [path for path, sig in self.linked.items() if FileStamp.of(self.remap(path)) != sig]

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
    model: ModelConfig,
    project_root: Path,
    snapshot: Snapshot | None = None,
    *,
    sources: Snapshot | None = None,
) -> dict[str, Any]:
    """The path fields of a worker spec, live or remapped into a snapshot. `sources`: the
    snapshot taken for this build; the worker imports the live paths but compiles each
    file it copied from the copy (worker/fresh_source.py): the code on disk when the build
    started, whatever was saved since."""

    def m(p: Path) -> Path:
        return snapshot.remap(p) if snapshot else p

    def entry(e: Any) -> dict[str, Any]:
        wire = e.to_wire()
        if e.file is not None:
            wire["file"] = str(m(e.file))
        return wire

    out = {
        "root": str(m(project_root.resolve())),
        "entry": entry(model.entry),
        "example": entry(model.example),
        "weights": [str(m(p)) for p in model.weights],
        "watch": [str(m(p)) for p in model.watch],
    }
    if model.golden is not None:  # in the model's code: the same copy as the example
        out["golden"] = entry(model.golden)
    if model.eval is not None:  # the same: a rollback scores with the kept version's eval
        out["eval"] = entry(model.eval)
    if model.adapters:  # peft adapter folders: their copies hold the last good files
        out["adapters"] = [{**a.to_wire(), "folder": str(m(a.folder))} for a in model.adapters]
    if sources is not None:
        out["sources"] = [[str(live), str(copy)] for live, copy in sources.roots]
    return out


def _place(
    src: Path,
    dst: Path,
    budget: list[int],
    snap: dict[str, dict[Path, FileStamp]],
    previous: Snapshot | None,
    settle_ns: int,
    *,
    copy_always: bool = False,
) -> None:
    """Copy (or link) `src` to `dst`, recording its signature in `snap`; reuse the copy in
    `previous` when the file has not changed since and had settled before it was taken.
    `copy_always` (an adapter's files): never linked to the live file, whatever its size,
    and not counted against MAX_COPY_BYTES (a guard against big trees of small files)."""
    private_dirs(dst.parent)
    st = src.stat()
    sig = FileStamp.of_stat(st)
    snap["sources"][src] = sig
    if (
        previous is not None
        and previous.sources.get(src) == sig
        and src not in previous.linked
        and st.st_ctime_ns < previous.taken_ns - settle_ns
    ):
        try:
            os.link(previous.remap(src), dst)  # our own copy, never written to: share it
            return
        except OSError:
            pass  # gone, or no hard links here: copy
    if copy_always:
        # An adapter saved in place (`save_pretrained` over the folder, or a script writing
        # the file through one descriptor) rewrites a linked copy too, and a restart then had
        # no good copy of it: the base served, the adapter answered 503.
        shutil.copy2(src, dst)
        os.chmod(dst, 0o600)
        return
    if st.st_size > LINK_ABOVE_BYTES:
        try:
            os.link(src, dst)
            snap["linked"][src] = sig
            return
        except OSError:
            pass
    budget[0] += st.st_size
    if budget[0] > MAX_COPY_BYTES:
        raise SnapshotTooLarge(
            f"the model's folders hold more than {MAX_COPY_BYTES // 2**20} MiB to copy; "
            "narrow `watch` or add `ignore` globs"
        )
    shutil.copy2(src, dst)
    os.chmod(dst, 0o600)  # copy2 copied the source's mode; the copy is the owner's alone


def private_dirs(folder: Path) -> None:
    """Create `folder` and its missing parents 0700: a snapshot holds the owner's code and
    weights (a hard-linked weights file keeps its own mode, so the folders must hide it)."""
    missing = []
    for p in (folder, *folder.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
        os.chmod(p, 0o700)  # mkdir's mode passes through the umask


def take_snapshot(
    base: Path,
    model: ModelConfig,
    version: int,
    rules: IgnoreRules,
    previous: Snapshot | None = None,
    *,
    settle_ns: int = SETTLED_NS,
) -> Snapshot:
    """Copy the model's watch roots, weights and adapter folders into base/vN (blocking: run
    in a thread); files unchanged since `previous` are linked to its copies."""
    taken_ns = time.time_ns()
    budget = [0]
    snap: dict[str, dict[Path, FileStamp]] = {"sources": {}, "linked": {}}

    adapter_files = {f for a in model.adapters for f in a.files}

    def place(src: Path, dst: Path) -> None:
        copy_always = src in adapter_files
        _place(src, dst, budget, snap, previous, settle_ns, copy_always=copy_always)

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
            for src in rules.files_under(root):
                if src.is_file():
                    place(src, copy / src.relative_to(root))
        weights: list[tuple[Path, Path]] = []
        for j, w in enumerate(model.weights):
            copy = folder / "weights" / f"{j}-{w.name}"
            place(w, copy)
            weights.append((w, copy))
        for k, adapter in enumerate(model.adapters):
            # A folder outside the watched ones gets a root of its own; its two files are
            # placed where `remap` finds them, ignored by the walk or not.
            if not any(r == adapter.folder or r in adapter.folder.parents for r, _ in roots):
                roots.append((adapter.folder, folder / "adapters" / f"{k}-{adapter.name}"))
            copies = Snapshot(version, folder, tuple(roots), ())
            for f in adapter.files:
                if f.is_file() and not copies.remap(f).exists():
                    place(f, copies.remap(f))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Snapshot(
        version, folder, tuple(roots), tuple(weights), taken_ns, snap["sources"], snap["linked"]
    )

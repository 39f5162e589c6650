"""The last good versions of a model, kept for `hotreload rollback` (`keep_versions`).

A kept version is what a build needs to make it again: the snapshot of its code and
weights files (engine/snapshots.py: small files copied, large ones hard-linked) and the
pushes it held (pushes.py `Overlay`: the trainer's tensors in shared memory
the session holds open). The engine keeps the push payloads, not the worker: the session
holds each push's memory already (every build lays them over the files' weights). While a
push serves, its memory is all it takes; once no serving version holds it, its bytes are
copied to the model's snapshot folder (`pushes/push-<id>.bin`, `spill`, after the job's
answer) and its memory let go, so kept pushes cost disk, never memory, bounded by
`keep_versions`. A rollback lays them again from a fresh sealed memfd (`restored`).

A rollback builds a kept version again under a new version number, through the same load,
warm, smoke and swap as any reload: from its snapshot as a restart builds from the last
good one (every path remapped: code, data files beside it, weights), its pushes laid
over them again. When the serving version holds the same files' weights and the same pushes
(a rollback of a code edit), the serving worker shares its tensors: nothing is read again.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotreload.engine.model.pushes import Overlay, WeightsPlan
from hotreload.engine.snapshots import Snapshot, code_paths, private_dirs
from hotreload.errors import BadRequestError

if TYPE_CHECKING:
    from hotreload.config import ModelConfig


@dataclass(frozen=True)
class KeptVersion:
    """One good version, as a rollback builds it again."""

    version: int
    #: Its code and weights files (the folder is shared by the versions a push made on it).
    snapshot: Snapshot
    #: The pushes it held, oldest first.
    overlays: tuple[Overlay, ...]
    #: The weights files as it found them (pushes.files_signature).
    weights_stat: tuple[Any, ...] | None
    #: Its weights digest (None: not known, or not a torch module).
    digest: str | None
    #: How it came: "start", "file", "push", "rollback", ...
    trigger: str
    #: A rollback: the version it served again.
    rollback_of: int | None = None
    #: The model's settings it was built with: a rollback builds only under the same ones
    #: (rollback.settings_changed), its weights files, entry and env are theirs.
    model: ModelConfig | None = None

    def describe(self) -> str:
        how = f"rollback to v{self.rollback_of}" if self.rollback_of else self.trigger
        pushed = f", {len(self.overlays)} push(es)" if self.overlays else ""
        return f"v{self.version} ({how}{pushed}, weights {self.digest or 'not hashed'})"


def kept_after(
    kept: list[KeptVersion], entry: KeptVersion, limit: int
) -> tuple[list[KeptVersion], list[KeptVersion]]:
    """The kept versions once `entry` serves (the newest `limit`), and those dropped."""
    now = [k for k in kept if k.version != entry.version] + [entry]
    return now[-limit:], now[:-limit] if len(now) > limit else []


def unused_snapshots(
    dropped: list[KeptVersion], kept: list[KeptVersion], *in_use: Snapshot | None
) -> list[Snapshot]:
    """The snapshots of `dropped` versions no kept version (nor `in_use`) still holds."""
    held = {k.snapshot.folder for k in kept} | {s.folder for s in in_use if s is not None}
    out: dict[Path, Snapshot] = {}
    for k in dropped:
        if k.snapshot.folder not in held:
            out[k.snapshot.folder] = k.snapshot
    return list(out.values())


def holds(kept: list[KeptVersion], overlay: Overlay) -> bool:
    """Does a kept version still need this push's memory?"""
    return any(overlay in k.overlays for k in kept)


def choose(name: str, kept: list[KeptVersion], serving: int, version: int | None) -> KeptVersion:
    """The kept version a rollback builds: `version`, or the one that served before the
    serving one. BadRequestError says which versions are kept when it is not one of them."""
    listed = ", ".join(f"v{k.version}" for k in kept) or "none"
    if version is None:
        earlier = [k for k in kept if k.version != serving]
        if not earlier:
            raise BadRequestError(
                f"model {name!r}: no earlier version is kept to roll back to (kept: {listed}); "
                "versions are kept once they serve, up to `keep_versions`"
            )
        return earlier[-1]
    if version == serving:
        raise BadRequestError(f"model {name!r}: v{version} is the version serving now")
    for k in kept:
        if k.version == version:
            return k
    raise BadRequestError(
        f"model {name!r}: v{version} is not kept (kept: {listed}); raise `keep_versions` "
        "to keep more, or name one of those"
    )


def why_not_buildable(k: KeptVersion) -> str | None:
    """Why a kept version cannot be built again with its own bytes, or None."""
    ipc = [o.id for o in k.overlays if not o.replayable]
    if ipc:
        ids = ", ".join(f"#{i}" for i in ipc)
        return (
            f"v{k.version} holds weights pushed over CUDA IPC ({ids}), which only the worker "
            "that read them could read; push them over shared memory (a CPU tensor) to keep "
            "them for a rollback"
        )
    rewritten = k.snapshot.rewritten()
    if rewritten:
        files = ", ".join(p.name for p in rewritten)
        return (
            f"{files} rewritten in place since v{k.version} loaded (large weights files are "
            "hard-linked, not copied): its bytes are gone; save weights to a new file and "
            "rename it over the old to keep earlier versions"
        )
    return None


def rollback_code(model: ModelConfig, root: Path, k: KeptVersion) -> dict[str, Any]:
    """The worker spec's code of a kept version: every path remapped into its snapshot, as a
    restart builds from the last good one (phases.make_spec "restart"): its code imported
    from the copies (a module renamed or deleted since is still there), the data files read
    beside the code, its weights files and adapter folders the snapshot's."""
    return code_paths(model, root, k.snapshot)


def rollback_plan(
    k: KeptVersion,
    overlays: list[Overlay],
    serving_overlays: list[Overlay],
    serving_stat: tuple[Any, ...] | None,
    *,
    same_worker: bool,
    serving_block: dict[str, Any] | None,
) -> WeightsPlan:
    """Where a rollback's weights come from: the serving version's tensors when it holds the
    same files' weights and the same pushes and builds in its own worker (nothing read);
    else the serving worker's block mapped (another worker, the same files) or the
    snapshot's files, with the kept version's pushes over them (`overlays`: the kept
    pushes with memory to read, `restored`)."""
    same_files = serving_stat is not None and serving_stat == k.weights_stat
    same_pushes = [o.id for o in serving_overlays] == [o.id for o in overlays]
    reuse = same_worker and same_files and same_pushes
    base = serving_block if not same_worker and same_files else None
    return WeightsPlan(k.weights_stat, list(overlays), reuse, None, [], base)


# ---------------------------------------------------------------------- pushes on disk


def pushes_folder(k: KeptVersion) -> Path:
    """Where the model's kept pushes are spilled: beside its snapshots."""
    return k.snapshot.folder.parent / "pushes"


def _spill_file(folder: Path, overlay: Overlay) -> Path:
    return folder / f"push-{overlay.id}.bin"


def _copy(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        n = os.sendfile(dst, src, done, size - done)
        if n == 0:
            raise OSError(f"short copy: {done} of {size} bytes")
        done += n


#: Free space a spill leaves on its disk, beyond the copy itself: the session's snapshots,
#: logs and the user's own files need room too.
SPILL_HEADROOM = 256 * 1024 * 1024


class NoRoom(OSError):
    """Too little free disk for a push's copy (`spill`): nothing was written."""


def spill(overlay: Overlay, folder: Path, headroom: int = SPILL_HEADROOM) -> None:
    """Copy a push's memory to `folder` (once; blocking: run in a thread), then let go of
    it. A push with no memfd (CUDA IPC only) has nothing to copy. NoRoom, before anything
    is written, when the copy would leave less than `headroom` bytes free; a copy that
    fails part way leaves no partial file."""
    if overlay.fd is None:
        return
    dst = _spill_file(folder, overlay)
    if not dst.exists():
        private_dirs(folder)
        size = os.fstat(overlay.fd).st_size
        free = shutil.disk_usage(folder).free
        if free < size + headroom:
            raise NoRoom(
                f"{size / 2**20:.0f} MiB to copy, {free / 2**20:.0f} MiB free on the disk of "
                f"{folder} (a copy leaves {headroom / 2**20:.0f} MiB free)"
            )
        tmp = dst.with_suffix(f".{os.getpid()}.tmp")
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            try:
                _copy(overlay.fd, out, size)
            finally:
                os.close(out)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a partial copy is no copy: never left to fill the disk
            raise
    overlay.close()


def restored(overlay: Overlay, folder: Path) -> Overlay:
    """`overlay` with memory to read again: itself while it holds its memfd, else a sealed
    memfd filled from its spilled copy (blocking: run in a thread). The same id, names and
    leaves: the same bytes."""
    if overlay.fd is not None:
        return overlay
    src = _spill_file(folder, overlay)
    name = f"hotreload-state-{secrets.token_hex(8)}"  # the form the worker checks
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        size = src.stat().st_size
        os.ftruncate(fd, size)
        inp = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _copy(inp, fd, size)
        finally:
            os.close(inp)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    state = {**overlay.state, "path": f"/proc/{os.getpid()}/fd/{fd}", "memfd_name": name}
    return Overlay(overlay.id, state, overlay.strict, fd, list(overlay.names), overlay.leaves)


def restored_all(overlays: tuple[Overlay, ...], folder: Path) -> list[Overlay]:
    """`restored` for each (blocking: run in a thread); on a failure part way, the memfds
    made for the earlier ones are closed before the error goes on: none leaks."""
    made: list[Overlay] = []
    try:
        for overlay in overlays:
            made.append(restored(overlay, folder))
    except BaseException:
        for overlay in made:
            if overlay not in overlays:  # made here, not a kept push's own memory
                overlay.close()
        raise
    return made


def unheld_pushes(kept: list[KeptVersion], serving: list[Overlay]) -> list[tuple[Overlay, Path]]:
    """The kept pushes still in memory that no serving version holds: to spill."""
    out: dict[int, tuple[Overlay, Path]] = {}
    for k in kept:
        for o in k.overlays:
            if o.fd is not None and o not in serving:
                out[id(o)] = (o, pushes_folder(k))
    return list(out.values())


def unused_spills(dropped: list[KeptVersion], kept: list[KeptVersion]) -> list[Path]:
    """The spilled copies of pushes only `dropped` versions held."""
    held = {o.id for k in kept for o in k.overlays}
    return sorted(
        {_spill_file(pushes_folder(k), o) for k in dropped for o in k.overlays if o.id not in held}
    )

"""Weights a trainer pushes from memory (`Client.update_weights`), as the session keeps them.

A push arrives as a descriptor of shared memory (protocol/shared_state.py): a memfd of the
trainer's, and/or CUDA IPC handles. The session opens the memfd itself, so the bytes stay
readable after the trainer's call returns, and keeps every push made since the weights
files last changed: each later build (a code edit, a restart after a crash, a respawn
worker) lays them over the files' weights in order, so the weights that answer never go
back to the checkpoint behind the trainer's back. A push over CUDA IPC can be read once
only (each handle counts one reader): a worker that did not read it cannot get it back,
and says so.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hotreload.config import ModelConfig
from hotreload.engine.file_stamp import FileStamp
from hotreload.errors import BadRequestError
from hotreload.protocol.push_leaves import MAX_LEAVES_JSON
from hotreload.protocol.shared_state import validate_descriptor

#: Closes memfds on a thread of its own: the last reference to 1 GiB of shared memory
#: frees its pages in close(2), 0.28 s measured, which must not stall the event loop.
_CLOSER = ThreadPoolExecutor(1, thread_name_prefix="hotreload-memfd-close")


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def close_later(fd: int) -> None:
    _CLOSER.submit(_close, fd)


@dataclass
class Overlay:
    """One push that serves (or is about to)."""

    id: int
    state: dict[str, Any]
    strict: bool
    #: The session's reference to the memfd (None: no tensor went through one).
    fd: int | None = None
    names: list[str] = field(default_factory=list)
    #: Its tensors' digest leaves by pushed name, as the client hashed them while packing
    #: (protocol/push_leaves.py) or the worker that built it first named them: a worker
    #: mapping it hashes none of those (worker/shared_weights.py).
    leaves: dict[str, Any] | None = None

    @property
    def replayable(self) -> bool:
        """Can a worker other than the first one read it (no CUDA IPC handle in it)?"""
        return all(t.get("via") == "memfd" for t in self.state.get("tensors", []))

    def wire(self) -> dict[str, Any]:
        out = {"id": self.id, "state": self.state, "strict": self.strict}
        return {**out, "leaves": self.leaves} if self.leaves else out

    def close(self) -> None:
        if self.fd is not None:
            close_later(self.fd)
            self.fd = None


def adopt(descriptor: Any, strict: bool, overlay_id: int) -> Overlay:
    """Check a client's descriptor and take a reference of the session's own to its memfd.
    BadRequestError says what is wrong (a malformed descriptor, memory already gone)."""
    try:
        validate_descriptor(descriptor)
    except ValueError as exc:
        raise BadRequestError(f"update_weights: {exc}") from None
    state = dict(descriptor)
    # Beside the state (Overlay.wire), when they fit a build request's bound. The size is
    # push_leaves.leaves_json_size's, written out: a call back into protocol/ here would be
    # a step out and back on the push path (benchmarks/reload_trace.py counts them).
    leaves = state.pop("leaves", None) or None
    if leaves and sum(len(k) + 8 + 67 * len(v) for k, v in leaves.items()) > MAX_LEAVES_JSON:
        leaves = None  # a worker mapping the push hashes it
    fd = None
    if state.get("path"):
        try:
            fd = os.open(state["path"], os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise BadRequestError(
                f"update_weights: the pushed memory {state['path']} cannot be opened "
                f"({exc.strerror}); the client closed it before the session read it, or runs "
                "as another user"
            ) from None
        state["path"] = f"/proc/{os.getpid()}/fd/{fd}"
    names = [t["name"] for t in state.get("tensors", [])]
    return Overlay(overlay_id, state, bool(strict), fd, names, leaves)


@dataclass
class WeightsBlock:
    """A worker's weights block (worker/shared_weights.py), held open by the session so a
    respawn worker can map it while the files are unchanged."""

    fd: int
    descriptor: dict[str, Any]

    def close(self) -> None:
        close_later(self.fd)


def adopt_block(descriptor: Any) -> WeightsBlock | None:
    """The session's own reference to a worker's weights block (None: it went already)."""
    if not isinstance(descriptor, dict) or not str(descriptor.get("path", "")).startswith("/proc/"):
        return None
    try:
        fd = os.open(descriptor["path"], os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    return WeightsBlock(fd, {**descriptor, "path": f"/proc/{os.getpid()}/fd/{fd}"})


def files_signature(model: ModelConfig) -> tuple[FileStamp | None, ...]:
    """The stamp of each weights file (file_stamp.py): any save or rename changes it."""
    return tuple(FileStamp.of(path) for path in model.weights)


@dataclass
class WeightsPlan:
    """Where the next build's weights come from, and what the version will hold."""

    #: The weights files as the build finds them.
    stat: tuple[Any, ...] | None
    #: The pushes the new version holds, oldest first (the new push last).
    overlays: list[Overlay]
    #: Share the serving version's tensors (its worker builds, the files are unchanged).
    reuse: bool
    push: Overlay | None = None
    #: Pushes over CUDA IPC this build cannot read again (another worker read them).
    lost: list[Overlay] = field(default_factory=list)
    #: The serving version's weights block, for another worker to map (files unchanged).
    base: dict[str, Any] | None = None
    #: Some files changed, these (indices) did not: the serving worker shares their tensors
    #: and reads the others (a sharded checkpoint with one shard saved again).
    unchanged_files: list[int] | None = None
    #: A restart: the serving version back in a new worker. An adapter whose files cannot
    #: be read (a save cut short) is left out, answering why, rather than the whole model.
    restart: bool = False

    def wire(self) -> dict[str, Any]:
        """The LOAD fields: a worker skips the pushes its base already holds."""
        return {
            "reuse": self.reuse,
            "overlays": [o.wire() for o in self.overlays],
            **({"base": self.base} if self.base else {}),
            **({"unchanged_files": self.unchanged_files} if self.unchanged_files else {}),
            **({"restart": True} if self.restart else {}),
        }


def plan_weights(
    model: ModelConfig,
    held: list[Overlay],
    held_stat: tuple[Any, ...] | None,
    *,
    same_worker: bool,
    restart: bool,
    push: Overlay | None,
    serving_block: dict[str, Any] | None = None,
) -> WeightsPlan:
    """The rule: the files' weights, then every push made since they last changed. A
    restart comes back on the serving version's (its snapshot of the files, and its
    pushes); a build whose files changed starts again from them."""
    if restart:
        stat, keep, reuse = held_stat, list(held), False
    else:
        stat = files_signature(model)
        unchanged = held_stat is not None and stat == held_stat
        keep = list(held) if unchanged else []
        reuse = unchanged and same_worker
    # Another worker maps the serving version's block (the files' weights as it read them)
    # instead of reading the files: they are unchanged (a restart's snapshot holds what the
    # block holds, too). The pushes are laid over it again.
    unchanged = restart or (held_stat is not None and stat == held_stat)
    base = serving_block if not same_worker and unchanged else None
    lost = [o for o in keep if not o.replayable and not reuse]
    keep = [o for o in keep if o not in lost] + ([push] if push is not None else [])
    plan = WeightsPlan(stat, superseded_dropped(keep), reuse, push, lost, base, restart=restart)
    if same_worker and not restart and not unchanged and not held and held_stat is not None:
        # No pushes lie over the serving tensors: those of the files unchanged are the files'.
        same = [i for i, (a, b) in enumerate(zip(stat, held_stat, strict=False)) if a and a == b]
        plan.unchanged_files = same if len(stat) == len(held_stat) else None
    return plan


def superseded_dropped(overlays: list[Overlay]) -> list[Overlay]:
    """The pushes still needed: one whose every tensor a later push sets again is not
    (a trainer pushing its whole state each time keeps one, not one per push)."""
    needed: list[Overlay] = []
    covered: set[str] = set()
    for overlay in reversed(overlays):
        if not set(overlay.names) <= covered:
            needed.append(overlay)
        covered |= set(overlay.names)
    return needed[::-1]


def stale_base(name: str, base: str | None, current: Any) -> str | None:
    """Why a push of the changed tensors only (client push_changes.py) cannot build, or
    None. It names the digest of the weights it goes on top of; over other weights (the
    files changed, a restarted session holds none of the trainer's pushes) it would make
    weights nobody trained. Asked when the push builds, after any job queued before it."""
    serving = getattr(current, "digest", None)
    if base is None or serving is None or serving == base:
        return None
    return (
        f"model {name!r}: this push holds only the tensors changed since weights "
        f"{base}, but {serving} serve (the weights files changed, or the session "
        "restarted); nothing was built, push every tensor"
    )


def why_in_serving_worker(
    strategy: Any, model: ModelConfig, record: Any, push: Overlay
) -> str | None:
    """Where a push builds: None, in the standby (strategy respawn), off the serving process
    and its CPUs (its read, digest and warm-up included), then handed over to; else why it
    builds in the serving worker ("" when the strategy keeps no standby). The standby lays
    the pushes again over the serving version's weights block (CPU weights read from the
    files, which the manager holds) or, for a model with no weights files, over nothing: a
    push of every tensor (strict) among them holds all its weights. Every push still held
    must be readable again (memfd, not CUDA IPC), and the weights files as the serving
    version read them (a delta push goes over exactly those weights)."""
    if not getattr(strategy, "wants_standby", False):
        return ""
    if record.standby is None or not record.standby.alive:
        # A fresh process would start and import for seconds: the push would wait for it.
        return "no standby worker is ready yet (one starts between jobs)"
    needed = superseded_dropped([*record.overlays, push])
    if not all(o.replayable for o in needed if o is not push):
        return "an earlier push it still holds came over CUDA IPC, which only it could read"
    if record.weights_stat is None or files_signature(model) != record.weights_stat:
        return "the weights files changed since the serving version read them"
    if record.current is None or (model.weights and record.current.block is None):
        return "its weights are in no block another worker can map (a GPU model)"
    if not model.weights and not any(o.strict for o in needed):
        return "it has no weights files and no push of every tensor (strict) to start from"
    return None


def builder(sup: Any, job: Any, outcome: Any) -> tuple[Any, str]:
    """The strategy a push builds with and its spec mode: the standby under respawn, else
    the serving worker (`why_in_serving_worker` says why in the history row)."""
    why = why_in_serving_worker(sup.strategy, sup.model, sup.record, job.push)
    if why is None:
        outcome.strategy = sup.strategy.name
        return sup.strategy, "push_elsewhere"
    if why:
        outcome.detail.append(f"built in the serving worker: {why}")
    return sup.inplace, "reload"


def keep_leaves(overlays: Any, leaves: Any) -> None:
    """The leaves a worker named for pushes (LOAD or DIGEST reply, by push id), kept on
    each push that has none yet: the same memfd, the same bytes."""
    if not isinstance(leaves, dict):
        return
    for o in overlays:
        got = leaves.get(str(o.id))
        if o.leaves is None and isinstance(got, dict) and got:
            o.leaves = got

"""A push's digest leaves, hashed by the client as it packs, so nobody hashes the bytes again.

A version's digest (worker/weights_digest.py) is built from leaves: the sha256 of each
8 MiB piece of each tensor's bytes. A pushed tensor that the new version serves as it is
(a CPU worker maps the sealed memfd; the tensor is a view of it, no cast) has the leaves of
exactly the bytes the client wrote. So the client hashes them while it writes: each piece
is hashed from the memfd, on a thread of its own, right after `pwrite` put it there and
while it is still in the cache. That is the one pass over the bytes, on the trainer's side,
overlapped with the write; the worker remembers the leaves for the tensors over the push
(worker/shared_weights.py `remember_over`) and hashes only what they do not cover (a cast,
a CUDA tensor, a tensor of the files).

The leaves are hashed from the memfd, not from the trainer's tensors: the memfd is what the
worker maps, and it is sealed once written, so the leaves say what serves even if another
thread of the trainer wrote a tensor meanwhile.

Descriptor part: `"leaves": {name: [64 hex digits, ...]}` for memfd tensors, as many leaves
as `leaf_count(nbytes)`; a name may be missing (the worker hashes it). Bounded by
`MAX_LEAVES_JSON`: a push whose leaves would not fit sends none (a missed speed-up, never a
wrong digest).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: The digest's leaf size (worker/weights_digest.py's format, version 1).
LEAF_BYTES = 8 * 2**20
#: Leaves named for one block or push at most, in hex with their names (a LOAD request's
#: header carries them; headers are bounded: protocol/framing.py). 96 KiB is about 1,400
#: leaves: 11 GiB of weights.
MAX_LEAVES_JSON = 96 * 1024
#: Hashing threads beside the writer: one keeps up with pwrite into a memfd (both about
#: 2 GB/s here); a second helps where sha256 is slower than the write.
MAX_HASH_THREADS = 2
#: A piece below this is hashed on the writer's thread: handing it to a thread costs more
#: than hashing it (a tiny Llama's 21 tensors: 2.4 ms packed with the pool, 1.0 inline).
INLINE_BYTES = 1 << 20
_HEX = re.compile(r"[0-9a-f]{64}")


def leaf_count(nbytes: int) -> int:
    return -(-nbytes // LEAF_BYTES)


def leaves_json_size(name: str, count: int) -> int:
    """About what `count` leaves of `name` take in a JSON header (`MAX_LEAVES_JSON`)."""
    return len(name) + 8 + 67 * count


def hash_threads(limit: int) -> int:
    """Threads to hash with: `limit`, or fewer where this process may run on fewer CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(limit, cpus))


def _map_read_only(fd: int, size: int) -> mmap.mmap:
    """`fd` mapped through a read-only descriptor of its own: a shared mapping of the
    writable one would count as writable, and the memfd could not be sealed (EBUSY)."""
    ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(ro, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(ro)


class LeafHasher:
    """Hashes the pieces of a memfd as they are written; `leaves()` waits for them all.
    Use as a context manager: it unmaps the memfd only after every hash has ended."""

    def __init__(self, fd: int, size: int) -> None:
        try:
            self._map = _map_read_only(fd, size) if size else None
        except OSError:  # out of descriptors or address space: a push without leaves
            self._map, size = None, 0
        self._view = memoryview(self._map) if self._map is not None else None
        #: False: nothing is hashed (no room in the header, or no mapping): no leaves.
        self.hashing = bool(size)
        self._pool: ThreadPoolExecutor | None = None  # started for the first big piece
        self._leaves: dict[str, list[Future[bytes]]] = {}

    def _sha256(self, start: int, end: int) -> bytes:
        assert self._view is not None
        return hashlib.sha256(self._view[start:end]).digest()

    def write(self, name: str, offset: int, nbytes: int, put: Callable[[int, int], None]) -> None:
        """`put(start, end)` writes bytes [start, end) of tensor `name` (at `offset` in the
        memfd); each leaf's piece is written, then (while `hashing`) hashed."""
        futures = self._leaves.setdefault(name, [])
        for start in range(0, nbytes, LEAF_BYTES):
            end = min(nbytes, start + LEAF_BYTES)
            put(start, end)
            if self.hashing:
                futures.append(self._hash(offset + start, offset + end))

    def _hash(self, start: int, end: int) -> Future[bytes]:
        if end - start >= INLINE_BYTES:
            try:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        hash_threads(MAX_HASH_THREADS), thread_name_prefix="hotreload-leaves"
                    )
                return self._pool.submit(self._sha256, start, end)
            except RuntimeError:
                pass  # the interpreter is shutting down (a push from atexit): no new threads
        done: Future[bytes] = Future()
        done.set_result(self._sha256(start, end))
        return done

    def leaves(self) -> dict[str, list[str]] | None:
        if not self.hashing:
            return None
        return {name: [f.result().hex() for f in fs] for name, fs in self._leaves.items()}

    def __enter__(self) -> LeafHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        for fs in self._leaves.values():
            for f in fs:
                f.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # no thread reads the mapping once it is closed
        if self._view is not None:
            self._view.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()


def check_leaves(leaves: Any, tensors: list[dict[str, Any]]) -> None:
    """Raise ValueError unless `leaves` (a descriptor's, or None) names memfd tensors of
    the descriptor with as many leaves of 64 hex digits as their bytes have pieces. Their
    size is not refused: the session keeps none over `MAX_LEAVES_JSON` (engine/model/pushes.py)."""
    if leaves is None:
        return
    if not isinstance(leaves, dict):
        raise ValueError(f"state.leaves must be an object (name -> leaves), got {leaves!r:.80}")
    sizes = {t["name"]: t["nbytes"] for t in tensors if t.get("via") == "memfd"}
    for name, hexes in leaves.items():
        if name not in sizes:
            raise ValueError(
                f"state.leaves names {name!r:.80}, which is no tensor of the state going via "
                "the memfd; leaves are for memfd tensors only"
            )
        want = leaf_count(sizes[name])
        if not isinstance(hexes, list) or len(hexes) != want:
            raise ValueError(
                f"state.leaves[{name!r}] must be a list of {want} leaves (one per "
                f"{LEAF_BYTES >> 20} MiB of its {sizes[name]} bytes)"
            )
        if not all(isinstance(h, str) and _HEX.fullmatch(h) for h in hexes):
            raise ValueError(
                f"state.leaves[{name!r}] must hold sha256 digests as 64 lowercase hex digits"
            )

"""A digest of a state's content: equal weights, equal digest, however they arrived.

    state_digest(model.state_dict())  ->  "sha256:3f1c...": 32 hex digits (128 bits)

Defined by content alone: names, dtypes, shapes and bytes, not by where the tensors live
(CPU or GPU), their strides, the file they came from or the order of the dict. A version
loaded from a safetensors file and the same weights pushed from memory give one digest.

The format (version 1), for anyone recomputing it elsewhere:

- each tensor's bytes: C-contiguous, little-endian, as its dtype stores them (bfloat16 and
  bool included: the raw bytes, no conversion), cut into 8 MiB chunks; each chunk's
  sha256 is a leaf (an empty tensor has no leaves);
- each tensor's record: `u32 length | JSON [name, dtype, shape, nbytes]` (compact
  separators, dtype as torch names it without "torch.", e.g. "bfloat16"), then its leaves;
- the digest: sha256 of `b"hotreload-state-v1\\0"` and every record in sorted name order;
  the text is "sha256:" and the first 32 hex digits (128 bits: plenty to tell versions
  apart, short enough to read in a status line).

Why leaves, not one sha256 over everything: chunks hash on several threads at once
(hashlib lets go of the GIL for big buffers) and a GPU tensor can be copied to the host a
chunk at a time, so the digest of a 14 GB model takes seconds, not tens of seconds.

Tied tensors (one storage under two names, as `state_dict()` shows a tied embedding and
head) are recorded under both names, so hash the model's `state_dict()` after loading,
not the file's dict: a file stores one name of a tied group, the model has them all.
Their shared bytes are hashed once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch

CHUNK_BYTES = 8 * 2**20
PREFIX = b"hotreload-state-v1\0"
#: Threads hashing at once: the serving version keeps computing meanwhile.
MAX_THREADS = 4
#: GPU chunks copied to the host ahead of the hashing (bounds host memory to this many).
_MAX_IN_FLIGHT = 8
_U32 = struct.Struct("<I")


def _threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


#: CPUs the hashing runs on (a worker's build CPUs; None: anywhere). Set with `hash_on`.
_PIN: frozenset[int] | None = None


def hash_on(cpus: frozenset[int] | list[int] | None) -> None:
    """Hash on these CPUs only: off the serving worker's own (`cpus` in the config). Each
    chunk re-pins its thread, because the manager moves every thread of a worker onto the
    serving CPUs when that worker starts serving, the hashing ones among them."""
    global _PIN
    _PIN = frozenset(cpus) if cpus else None


def _sha256(chunk: torch.Tensor) -> bytes:
    if _PIN is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, _PIN)
    return hashlib.sha256(memoryview(chunk.numpy())).digest()


def _record_head(name: str, t: torch.Tensor) -> bytes:
    dtype = str(t.dtype).removeprefix("torch.")
    head = json.dumps([name, dtype, list(t.shape), t.nbytes], separators=(",", ":"))
    data = head.encode()
    return _U32.pack(len(data)) + data


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a 1-d uint8 tensor on its device (a copy only when strided)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _leaves(pool: ThreadPoolExecutor, t: torch.Tensor) -> list[Future[bytes]]:
    flat = _flat_bytes(t)
    n = flat.numel()
    futures: list[Future[bytes]] = []
    for start in range(0, n, CHUNK_BYTES):
        chunk = flat[start : start + CHUNK_BYTES]
        if chunk.device.type != "cpu":
            # Bound the host copies waiting for a thread before making another.
            if len(futures) >= _MAX_IN_FLIGHT:
                futures[-_MAX_IN_FLIGHT].result()
            chunk = chunk.cpu()
        futures.append(pool.submit(_sha256, chunk))
    return futures


def state_digest(state: Mapping[str, torch.Tensor], *, threads: int | None = None) -> str:
    """The content digest of `state` (name -> tensor, on any device); see the module doc."""
    names = sorted(state)
    # Tensors over the same bytes (tied weights) share their leaves: hashed once.
    shared: dict[tuple[str, int, int, str], list[Future[bytes]]] = {}
    with ThreadPoolExecutor(threads or _threads(), thread_name_prefix="digest") as pool:
        leaves: list[list[Future[bytes]]] = []
        for name in names:
            t = state[name]
            key = (str(t.device), t.data_ptr(), t.nbytes, str(t.dtype))
            same = shared.get(key) if t.is_contiguous() and t.nbytes else None
            if same is None:
                same = _leaves(pool, t)
                if t.is_contiguous() and t.nbytes:
                    shared[key] = same
            leaves.append(same)
        top = hashlib.sha256(PREFIX)
        for name, futures in zip(names, leaves, strict=True):
            top.update(_record_head(name, state[name]))
            for f in futures:
                top.update(f.result())
    return "sha256:" + top.hexdigest()[:32]


def digest_later(state: Mapping[str, torch.Tensor]) -> Future[str]:
    """`state_digest` on a thread of its own: a reload's first new answer need not wait for
    the hashing of a big model (about 0.5 s per GiB here). The thread ends with the hashing:
    a worker keeps no thread of a build past it (on the build's CPUs, worker/placement.py)."""
    fut: Future[str] = Future()

    def run() -> None:
        try:
            fut.set_result(state_digest(state))
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=run, name="hotreload-digest", daemon=True).start()
    return fut

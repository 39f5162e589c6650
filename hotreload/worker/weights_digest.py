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
- an entry that is not a plain tensor (a quantized layer's state: packed parameters hold a
  dtype and a tuple) is recorded as plain tensors first (`plain_entries`): a quantized
  tensor as its integer values under its name and its quantization under `name#scale`,
  `name#zero_point` (float64, int64) and `name#qscheme` (the text, as uint8); a tuple or
  list as its items under `name.0`, `name.1`, ...; anything else (a dtype, a number) as
  the UTF-8 bytes of its repr(), as uint8;
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

Leaves are remembered per tensor (`_Remembered`): a version that shares most tensors with
the one before it (a LoRA push over a frozen base, one shard saved again) hashes only its
new tensors. A tensor is the same when it is a view of the same live storage (held weakly:
a freed storage whose address is reused is not mistaken for it) at the same offset, shape,
strides and dtype, and its in-place version counter has not moved. Not seen: a write that
moves no counter (through `.data`); a model that writes its weights while serving is not
supported anyway. Leaves also come from elsewhere (worker/shared_weights.py
`remember_over`): a weights block or a push another worker hashed first, and a push's
memfd, which the client hashed as it wrote it (protocol/push_leaves.py): the sender's word
for sealed bytes, so a client of its own making must compute them as above, or send none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from hotreload.protocol.push_leaves import LEAF_BYTES, hash_threads

#: A leaf's piece (a client hashing a push as it packs uses the same: push_leaves.py).
CHUNK_BYTES = LEAF_BYTES
PREFIX = b"hotreload-state-v1\0"
#: Threads hashing at once: the serving version keeps computing meanwhile.
MAX_THREADS = 4
#: GPU chunks copied to the host ahead of the hashing (bounds host memory to this many).
_MAX_IN_FLIGHT = 8
_U32 = struct.Struct("<I")


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


def _leaves(pool: ThreadPoolExecutor, t: torch.Tensor) -> list[Future[bytes]]:
    # The bytes as a 1-d uint8 tensor on its device (a copy only when strided).
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    futures: list[Future[bytes]] = []
    for start in range(0, flat.numel(), CHUNK_BYTES):
        chunk = flat[start : start + CHUNK_BYTES]
        if chunk.device.type != "cpu":
            # Bound the host copies waiting for a thread before making another.
            if len(futures) >= _MAX_IN_FLIGHT:
                futures[-_MAX_IN_FLIGHT].result()
            chunk = chunk.cpu()
        futures.append(pool.submit(_sha256, chunk))
    return futures


class _Remembered:
    """Leaves of tensors hashed before, while their storage lives (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: id(storage) -> (weak reference to it, {view key: leaves}).
        self._by_storage: dict[
            int, tuple[weakref.ref[Any], dict[tuple[Any, ...], list[bytes]]]
        ] = {}
        #: Keys whose storage was freed (list.append: safe from a weakref callback).
        self._dead: list[int] = []
        #: Bytes hashed (not remembered) since the worker started: tests and benchmarks read it.
        self.hashed_bytes = 0

    @staticmethod
    def _view(t: torch.Tensor) -> tuple[Any, ...] | None:
        """What makes `t` the same tensor again; None: not to be remembered (an inference
        tensor keeps no version counter, so a write to it could not be told)."""
        if t.is_sparse or t.device.type == "meta" or t.is_inference():
            return None
        return (t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t._version)

    def get(self, t: torch.Tensor) -> list[bytes] | None:
        view = self._view(t)
        if view is None:
            return None
        storage = t.untyped_storage()
        with self._lock:
            held = self._by_storage.get(id(storage))
            if held is None or held[0]() is not storage:
                return None
            return held[1].get(view)

    def put(self, t: torch.Tensor, leaves: list[bytes]) -> None:
        view = self._view(t)
        if view is None:
            return
        storage = t.untyped_storage()
        key = id(storage)

        def gone(_: Any, key: int = key) -> None:
            # No lock here: the collector may free a storage (and call this) on a thread
            # that holds the lock already. Dropped at the next `put`.
            self._dead.append(key)

        with self._lock:
            while self._dead:
                k = self._dead.pop()
                dead = self._by_storage.get(k)
                if dead is not None and dead[0]() is None:
                    del self._by_storage[k]
            held = self._by_storage.get(key)
            if held is None or held[0]() is not storage:
                try:
                    held = (weakref.ref(storage, gone), {})
                except TypeError:
                    return  # a storage kind that takes no weak reference: not remembered
                self._by_storage[key] = held
            held[1][view] = leaves


REMEMBERED = _Remembered()


def _text(value: str) -> torch.Tensor:
    return torch.tensor(list(value.encode()), dtype=torch.uint8)


def plain_entries(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """`state` with every entry a plain tensor (the module doc says how the others are):
    `state` itself when they are all plain already."""
    if all(isinstance(t, torch.Tensor) and not t.is_quantized for t in state.values()):
        return dict(state)
    out: dict[str, torch.Tensor] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.is_quantized:
            out[name] = value.int_repr()
            scheme = value.qscheme()
            if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                scale = torch.tensor([value.q_scale()], dtype=torch.float64)
                zero = torch.tensor([value.q_zero_point()], dtype=torch.int64)
            else:
                scale = value.q_per_channel_scales().to(torch.float64)
                zero = value.q_per_channel_zero_points().to(torch.int64)
                scheme = f"{scheme}:{value.q_per_channel_axis()}"  # type: ignore[assignment]
            out[f"{name}#scale"], out[f"{name}#zero_point"] = scale, zero
            out[f"{name}#qscheme"] = _text(str(scheme))
        elif isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                add(f"{name}.{i}", item)
        else:
            out[name] = _text(repr(value))

    for name, value in state.items():
        add(name, value)
    return out


def state_digest(state: Mapping[str, torch.Tensor], *, threads: int | None = None) -> str:
    """The content digest of `state` (name -> tensor, on any device); see the module doc."""
    state = plain_entries(state)
    names = sorted(state)
    # Tensors over the same bytes (tied weights) share their leaves: hashed once.
    shared: dict[tuple[str, int, int, str], Sequence[Future[bytes] | bytes]] = {}
    fresh: list[tuple[torch.Tensor, list[Future[bytes]]]] = []
    with ThreadPoolExecutor(
        threads or hash_threads(MAX_THREADS), thread_name_prefix="digest"
    ) as pool:
        leaves: list[Sequence[Future[bytes] | bytes]] = []
        for name in names:
            t = state[name]
            key = (str(t.device), t.data_ptr(), t.nbytes, str(t.dtype))
            same = shared.get(key) if t.is_contiguous() and t.nbytes else None
            if same is None:
                same = REMEMBERED.get(t)
                if same is None:
                    fresh.append((t, _leaves(pool, t)))
                    same = fresh[-1][1]
                    REMEMBERED.hashed_bytes += t.nbytes
                if t.is_contiguous() and t.nbytes:
                    shared[key] = same
            leaves.append(same)
        top = hashlib.sha256(PREFIX)
        for name, pieces in zip(names, leaves, strict=True):
            top.update(_record_head(name, state[name]))
            for leaf in pieces:
                top.update(leaf if isinstance(leaf, bytes) else leaf.result())
    for t, futures in fresh:
        REMEMBERED.put(t, [f.result() for f in futures])
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

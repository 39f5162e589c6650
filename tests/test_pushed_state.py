"""Pushed states: pack (client side, no torch) -> descriptor -> read (worker side), the
checks at the edge, and the content digest (equal for a file and a push)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotreload.protocol import shared_state
from hotreload.protocol.shared_state import ALIGN, pack_state, validate_descriptor
from hotreload.worker.pushed_state import read_state
from hotreload.worker.weights_digest import state_digest

REPO = Path(__file__).resolve().parent.parent
DTYPES = [
    torch.float32,
    torch.float16,
    torch.float64,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=dtype)


def _round_trip(state: dict[str, Any], device: str = "cpu") -> dict[str, torch.Tensor]:
    with pack_state(state) as packed:
        # Through JSON, as the header travels: nothing in it may need Python objects.
        descriptor = json.loads(json.dumps(packed.descriptor))
        validate_descriptor(descriptor)
        return read_state(descriptor, device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_for_bit(dtype: torch.dtype) -> None:
    state = {
        "w": _sample(dtype, (33, 7)),
        "scalar": _sample(dtype, ()),
        "strided": _sample(dtype, (6, 10), 1)[:, ::3],  # not contiguous
        "transposed": _sample(dtype, (5, 4), 2).t(),
        "empty": _sample(dtype, (0, 3)),
    }
    out = _round_trip(state)
    assert list(out) == list(state)
    for name, t in state.items():
        assert _same(out[name], t), name
        assert out[name].is_contiguous()


def test_bfloat16_keeps_its_bits_nan_and_infinities_included() -> None:
    patterns = [0x7FC1, 0xFF80, 0x7F80, 0x0001, 0x8000, 0x3F80]  # NaN, -inf, inf, tiny, -0, 1
    bits = torch.from_numpy(np.array(patterns, dtype=np.uint16).view(np.int16))
    t = bits.view(torch.bfloat16)
    out = _round_trip({"t": t})["t"]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), bits)


def test_numpy_arrays_big_endian_and_ml_dtypes_bfloat16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    big = np.arange(12, dtype=">i4").reshape(3, 4)
    bf = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    state = {
        "f32": np.linspace(0, 1, 10, dtype=np.float32),
        "big": big,
        "strided": np.arange(20, dtype=np.float64)[::4],
        "bool": np.array([True, False, True]),
        "bf16": bf,
        "zero_d": np.array(7, dtype=np.int64),
    }
    out = _round_trip(state)
    assert torch.equal(out["f32"], torch.from_numpy(state["f32"]))
    assert torch.equal(out["big"], torch.arange(12, dtype=torch.int32).reshape(3, 4))
    assert torch.equal(
        out["strided"], torch.tensor([0.0, 4.0, 8.0, 12.0, 16.0], dtype=torch.float64)
    )
    assert out["bool"].tolist() == [True, False, True]
    assert out["bf16"].dtype == torch.bfloat16 and out["bf16"].tolist() == [1.5, -2.0, 3.25]
    assert out["zero_d"].shape == () and out["zero_d"].item() == 7


def test_parameters_that_require_grad_are_pushed_as_plain_data() -> None:
    model = torch.nn.Linear(4, 3)
    out = _round_trip(dict(model.state_dict(keep_vars=True)))
    assert not out["weight"].requires_grad
    assert torch.equal(out["weight"], model.weight.detach())


def test_empty_state() -> None:
    with pack_state({}) as packed:
        d = packed.descriptor
        assert d == {
            "kind": "memfd", "path": None, "memfd_name": None, "size": 0,
            "chunks": [], "tensors": [],
        }  # fmt: skip
        validate_descriptor(d)
        assert read_state(d, "cpu") == {}


def test_layout_is_aligned_and_the_memfd_sealed() -> None:
    state = {f"t{i}": torch.ones(i) for i in range(1, 9)}
    with pack_state(state) as packed:
        d = packed.descriptor
        assert d["kind"] == "memfd" and d["path"] == f"/proc/{os.getpid()}/fd/{packed.fd}"
        assert all(t["offset"] % ALIGN == 0 and t["via"] == "memfd" for t in d["tensors"])
        last = d["tensors"][-1]
        assert d["size"] == last["offset"] + last["nbytes"] == os.fstat(packed.fd).st_size
        with pytest.raises(PermissionError):
            os.pwrite(packed.fd, b"x", 0)  # sealed: the worker reads what was packed
    assert packed.fd is None


def test_the_pushed_copy_is_the_workers_own() -> None:
    src = torch.arange(10, dtype=torch.float32)
    out = _round_trip({"x": src})
    src.zero_()
    assert out["x"].tolist() == list(map(float, range(10)))


def test_unsupported_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'c'.*complex64"):
        pack_state({"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match=r"'m'.*meta device"):
        pack_state({"m": torch.empty(3, device="meta")})
    with pytest.raises(ValueError, match=r"'s'.*dtype"):
        pack_state({"s": np.array(["a", "b"])})


# ----------------------------------------------------------------------------- two processes

_READ_AND_DIGEST = """
import json, sys
from hotreload.worker.pushed_state import read_state
from hotreload.worker.weights_digest import state_digest
print(state_digest(read_state(json.loads(sys.stdin.read()), "cpu")))
"""


def test_another_process_reads_the_state() -> None:
    state = {"a": _sample(torch.float32, (300, 200)), "b": _sample(torch.bfloat16, (17,), 3)}
    with pack_state(state) as packed:
        out = subprocess.run(
            [sys.executable, "-c", _READ_AND_DIGEST],
            input=json.dumps(packed.descriptor),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == state_digest(state)


_SENDER = """
import sys, numpy as np
from hotreload.protocol.shared_state import pack_state
import json
packed = pack_state({"x": np.arange(1000, dtype=np.int64)})
print(json.dumps(packed.descriptor), flush=True)
sys.stdin.readline()
packed.close()
"""


def test_memory_opened_before_the_sender_closes_outlives_the_sender() -> None:
    """The contract the client relies on: once the worker has opened the path, the client
    may close its fd (and even exit); the worker's reference keeps the bytes."""
    sender = subprocess.Popen(
        [sys.executable, "-c", _SENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert sender.stdout is not None and sender.stdin is not None
    try:
        d = json.loads(sender.stdout.readline())
        fd = os.open(d["path"], os.O_RDONLY)
    finally:
        sender.stdin.write("\n")
        sender.stdin.close()
        sender.wait(timeout=30)
    try:
        assert not os.path.exists(d["path"])  # gone for anyone opening it now
        offset, nbytes = d["tensors"][0]["offset"], d["tensors"][0]["nbytes"]
        data = os.pread(fd, nbytes, offset)
        assert np.array_equal(np.frombuffer(data, np.int64), np.arange(1000))
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- reader errors


def test_a_closed_state_is_gone() -> None:
    packed = pack_state({"x": torch.ones(3)})
    d = packed.descriptor
    packed.close()
    with pytest.raises(ValueError, match="memory is gone"):
        read_state(d, "cpu")


def test_a_reused_fd_number_is_not_taken_for_the_state() -> None:
    packed = pack_state({"x": torch.ones(3)})
    d, fd = packed.descriptor, packed.fd
    packed.close()
    other = pack_state({"x": torch.zeros(3)})  # the same shape, so the same size
    try:
        assert other.fd == fd  # the lowest free number: the old path names the new memfd
        with pytest.raises(ValueError, match="not the pushed state's memory any more"):
            read_state(d, "cpu")
    finally:
        other.close()


def test_an_unsealed_memfd_is_refused() -> None:
    name = "hotreload-state-0123456789abcdef"
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 64)
        d = {
            "kind": "memfd",
            "path": f"/proc/{os.getpid()}/fd/{fd}",
            "memfd_name": name,
            "size": 64,
            "tensors": [
                {
                    "name": "x",
                    "dtype": "uint8",
                    "shape": [64],
                    "nbytes": 64,
                    "via": "memfd",
                    "offset": 0,
                }
            ],
        }
        with pytest.raises(ValueError, match="not sealed"):
            read_state(d, "cpu")
    finally:
        os.close(fd)


def test_a_size_that_does_not_match_the_memfd_is_refused() -> None:
    with pack_state({"x": torch.ones(3)}) as packed:
        d = copy.deepcopy(packed.descriptor)
        d["size"] += 64
        with pytest.raises(ValueError, match=r"holds 12 bytes, not the 76"):
            read_state(d, "cpu")


def test_permission_denied_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    with pack_state({"x": torch.ones(3)}) as packed:

        def denied(*args: Any, **kwargs: Any) -> int:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(os, "open", denied)
        with pytest.raises(ValueError, match="same user"):
            read_state(packed.descriptor, "cpu")


# ----------------------------------------------------------------------------- CUDA IPC, faked


class _FakeIpc:
    """torch's three IPC calls, faked with CPU memory where no GPU is: `_share_cuda_` keeps
    the storage it shares and hands out a handle naming it, `_new_shared_cuda` gives that
    storage back, `_release_ipc_counter` records a count given back. Everything else is
    real: the tensors' copies into chunks, the descriptor, the views and the copies out.
    A tensor is "on the GPU" when it carries `on_gpu = True`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shared: list[torch.UntypedStorage] = []
        self.opened: list[int] = []
        self.released: list[int] = []
        real = shared_state._device_type
        monkeypatch.setattr(
            shared_state, "_device_type", lambda v: "cuda" if getattr(v, "on_gpu", 0) else real(v)
        )
        share = self._share  # a plain function on the class: called with the storage
        monkeypatch.setattr(torch.UntypedStorage, "_share_cuda_", lambda st: share(st))
        monkeypatch.setattr(torch.UntypedStorage, "_new_shared_cuda", self._open, raising=False)
        monkeypatch.setattr(
            torch.UntypedStorage, "_release_ipc_counter", self._release, raising=False
        )
        props = type("P", (), {"uuid": "GPU-fake"})()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
        #: What was synchronized, in order: "device" (every stream) or "stream" (one).
        self.synced: list[str] = []
        stream = type("S", (), {"synchronize": lambda _: self.synced.append("stream")})()
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: self.synced.append("device"))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: stream)

    def _share(self, storage: torch.UntypedStorage) -> tuple[Any, ...]:
        i = len(self.shared)
        self.shared.append(storage)
        ref = f"/torch_ref_{i}".encode()
        return (0, f"mem-{i}".encode(), storage.nbytes(), 0, ref, 8 * i, b"event", True)

    def _open(self, *args: Any) -> torch.UntypedStorage:
        index, handle, size, offset, ref, ref_offset, event, sync = args
        i = int(handle.decode().removeprefix("mem-"))
        assert (index, size, offset, ref, ref_offset, event, sync) == (
            0, self.shared[i].nbytes(), 0, f"/torch_ref_{i}".encode(), 8 * i, b"event", False,
        )  # fmt: skip
        self.opened.append(i)
        return self.shared[i]

    def _release(self, handle: bytes, offset: int, device: int | None = None) -> None:
        self.released.append(int(handle.decode().removeprefix("/torch_ref_")))


def _on_gpu(t: torch.Tensor) -> torch.Tensor:
    t.on_gpu = True  # type: ignore[attr-defined]
    return t


def _gpu_state(n: int = 300) -> dict[str, torch.Tensor]:
    """A model-like state: many small tensors of every dtype, and the awkward ones."""
    state = {
        f"layer{i}.weight": _sample(DTYPES[i % len(DTYPES)], (3, i % 7 + 1), i) for i in range(n)
    }
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state |= {
        "view": base[1:, ::2],  # not contiguous: gathered by the copy into the chunk
        "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 3),
        "param": torch.nn.Parameter(torch.ones(5)),  # requires grad
    }
    return {k: _on_gpu(v) for k, v in state.items()}


def test_cuda_tensors_travel_in_one_chunk_by_one_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    ipc = _FakeIpc(monkeypatch)
    state = _gpu_state()
    expected = {k: v.detach().clone() for k, v in state.items()}
    with pack_state(state | {"host": np.ones(3, np.float32)}) as packed:
        d = json.loads(json.dumps(packed.descriptor))
        for t in state.values():  # the trainer's next step: the push keeps what was packed
            t.data.fill_(0)
        validate_descriptor(d)
        out = read_state(d, "cpu")
    assert d["kind"] == "mixed" and len(d["chunks"]) == 1 and len(ipc.shared) == 1
    assert ipc.opened == [0] and ipc.released == []  # opened once, for all 304 tensors
    # Packing: the device before the copies (the trainer's streams), their stream after;
    # reading: the stream before the chunk is let go. No IPC event is left to open.
    assert ipc.synced == ["device", "stream", "stream"]
    assert d["chunks"][0]["handle"]["event_sync_required"] is False
    gpu = [t for t in d["tensors"] if t["via"] == "cuda_ipc"]
    assert all(t["offset"] % 512 == 0 for t in gpu)
    assert {t["name"]: t["chunk"] for t in gpu}["empty"] is None
    assert d["chunks"][0]["device_uuid"] == "GPU-fake"
    for name, want in expected.items():
        assert _same(out[name], want), name
        assert out[name].untyped_storage().data_ptr() != ipc.shared[0].data_ptr()
    assert state_digest(out) == state_digest({**expected, "host": torch.ones(3)})


def test_chunks_fill_up_to_their_size_and_each_opens_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotreload.protocol import cuda_chunks

    ipc = _FakeIpc(monkeypatch)
    monkeypatch.setattr(cuda_chunks, "CHUNK_BYTES", 4096)
    state = {f"t{i}": _on_gpu(torch.full((250,), float(i))) for i in range(6)}  # 1000 B each
    state["big"] = _on_gpu(torch.arange(2500, dtype=torch.float32))  # 10000 B: its own chunk
    state["last"] = _on_gpu(torch.ones(10))
    with pack_state(state) as packed:
        d = packed.descriptor
        placed = {t["name"]: (t["chunk"], t["offset"]) for t in d["tensors"]}
        assert placed == {
            "t0": (0, 0), "t1": (0, 1024), "t2": (0, 2048), "t3": (0, 3072),
            "t4": (1, 0), "t5": (1, 1024), "big": (2, 0), "last": (3, 0),
        }  # fmt: skip
        assert [c["size"] for c in d["chunks"]] == [4072, 2024, 10000, 40]
        out = read_state(d, "cpu")
    assert ipc.opened == [0, 1, 2, 3]
    for name, want in state.items():
        assert _same(out[name], want.detach()), name


def test_a_state_never_sent_gives_its_ipc_counts_back(monkeypatch: pytest.MonkeyPatch) -> None:
    ipc = _FakeIpc(monkeypatch)
    # A bad value anywhere: refused before any chunk is shared (nothing to give back).
    with pytest.raises(ValueError, match="complex64"):
        pack_state({"g": _on_gpu(torch.ones(2)), "c": torch.zeros(1, dtype=torch.complex64)})
    assert ipc.shared == []
    packed = pack_state({"g": _on_gpu(torch.ones(4)), "h": np.ones(2, np.float32)})
    assert len(ipc.shared) == 1
    packed.abandon()
    assert ipc.released == [0]
    assert packed.fd is None


def test_a_read_that_stops_gives_back_the_counts_of_chunks_not_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hotreload.protocol import cuda_chunks

    ipc = _FakeIpc(monkeypatch)
    monkeypatch.setattr(cuda_chunks, "CHUNK_BYTES", 1024)
    state = {f"t{i}": _on_gpu(torch.ones(200)) for i in range(3)}  # one chunk each
    with pack_state(state) as packed:
        d = copy.deepcopy(packed.descriptor)
    d["chunks"][1]["device_uuid"] = "GPU-other"
    with pytest.raises(ValueError, match="GPU-other, which this worker cannot see"):
        read_state(d, "cpu")
    # Chunk 0 was opened and read (its mapping dropped); 1 failed to open and 2 never was.
    assert ipc.opened == [0] and ipc.released == [1, 2]


def test_a_cuda_push_without_cuda_here_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeIpc(monkeypatch)
    with pack_state({"g": _on_gpu(torch.ones(3))}) as packed:
        d = copy.deepcopy(packed.descriptor)
    assert d["kind"] == "cuda_ipc" and d["path"] is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="has no CUDA device"):
        read_state(d, "cpu")


# ----------------------------------------------------------------------------- validation


def _valid() -> dict[str, Any]:
    handle = {
        "handle": "bWVtLTA=",
        "storage_size_bytes": 640,
        "storage_offset_bytes": 0,
        "ref_counter_handle": "L3RvcmNoX3JlZl8w",
        "ref_counter_offset": 0,
        "event_handle": "ZXZlbnQ=",
        "event_sync_required": True,
    }
    return {
        "kind": "mixed",
        "path": "/proc/123/fd/4",
        "memfd_name": "hotreload-state-0123456789abcdef",
        "size": 12,
        "chunks": [{"device": 0, "device_uuid": "GPU-fake", "size": 640, "handle": handle}],
        "tensors": [
            {"name": "gpu", "dtype": "float32", "shape": [4, 8], "nbytes": 128,
             "via": "cuda_ipc", "chunk": 0, "offset": 512},
            {"name": "cpu", "dtype": "float32", "shape": [3], "nbytes": 12,
             "via": "memfd", "offset": 0},
        ],
    }  # fmt: skip


def _set(path: str, value: Any) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        *keys, last = path.split(".")
        target: Any = d
        for k in keys:
            target = target[int(k)] if k.isdigit() else target[k]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return mutate


_DELETE = object()


def _older_client(d: dict[str, Any]) -> None:
    """A CUDA entry as clients before the chunks wrote it: a handle of its own."""
    entry = d["tensors"][0]
    del entry["chunk"], entry["offset"]
    entry |= {"device": 0, "storage_offset": 0, "stride": [8, 1], "handle": {}}


MALFORMED = [
    (_set("tensors", {}), "tensors must be a list"),
    (_set("size", -1), "state.size must be a byte count"),
    (_set("kind", "memfd"), "kind is 'memfd' but its tensors go via"),
    (_set("path", "/etc/passwd"), "state.path must be '/proc/<pid>/fd/<fd>'"),
    (_set("path", None), "state.path must be"),
    (_set("memfd_name", "other"), "state.memfd_name must be"),
    (_set("tensors.1.name", ""), "name must be a non-empty string"),
    (_set("tensors.1.name", "gpu"), "'gpu' appears twice"),
    (_set("tensors.1.dtype", "complex64"), "unknown dtype 'complex64'"),
    (_set("tensors.1.shape", [3, -1]), "shape must be a list of sizes >= 0"),
    (_set("tensors.1.shape", [True]), "shape must be a list of sizes >= 0"),
    (_set("tensors.1.shape", "3"), "shape must be a list"),
    (_set("tensors.1.nbytes", 13), "nbytes 13 does not match dtype float32 and shape [3]"),
    (_set("tensors.1.offset", 8), "offset must be a multiple of 64"),
    (_set("tensors.1.offset", 64), "run past the end of the memfd"),
    (_set("tensors.1.via", "socket"), "via must be one of memfd, cuda_ipc"),
    (_set("chunks", {}), "state.chunks must be a list"),
    (lambda d: d["chunks"].__setitem__(0, 1), "state.chunks[0] must be an object"),
    (_set("chunks.0.device", -1), "device must be a CUDA device index"),
    (_set("chunks.0.device_uuid", 5), "device_uuid must be a string or null"),
    (_set("chunks.0.size", 0), "size must be a byte count > 0"),
    (_set("chunks.0.handle", "abc"), "handle must be an object"),
    (_set("chunks.0.handle.handle", "not base64!"), "handle.handle must be base64"),
    (_set("chunks.0.handle.handle", None), "handle.handle must be base64"),
    (_set("chunks.0.handle.event_sync_required", 1), "event_sync_required must be true"),
    (_set("chunks.0.handle.storage_size_bytes", 100), "fewer than the chunk's 640"),
    (_set("chunks.0.handle.ref_counter_offset", 10000), "ref_counter_offset must be below"),
    (_set("tensors.0.chunk", 1), "chunk must index state.chunks"),
    (_older_client, "descriptor is from an older hotreload client"),
    (_set("tensors.0.chunk", None), "only an empty tensor has no chunk"),
    (_set("tensors.0.offset", 256), "offset must be a multiple of 512"),
    (_set("tensors.0.offset", 1024), "run past the end of chunk 0"),
    (_set("tensors.0.via", "memfd"), "run past the end of the memfd"),
    (lambda d: d["chunks"].append(d["chunks"][0]), "state.chunks[1] holds no tensor"),
]


@pytest.mark.parametrize(("mutate", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_validate_descriptor_names_the_problem(mutate: Any, message: str) -> None:
    d = _valid()
    validate_descriptor(d)
    mutate(d)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_descriptor(d)


def test_validate_descriptor_refuses_non_objects() -> None:
    with pytest.raises(ValueError, match="must be an object"):
        validate_descriptor([])
    d = _valid()
    d["tensors"][1] = "x"
    with pytest.raises(ValueError, match=r"tensors\[1\] must be an object"):
        validate_descriptor(d)


def test_validate_descriptor_can_require_the_clients_own_memory() -> None:
    d = _valid()
    validate_descriptor(d, peer_pid=123)
    with pytest.raises(ValueError, match="not of the client"):
        validate_descriptor(d, peer_pid=999)


def test_memfd_fields_must_be_empty_without_memfd_tensors() -> None:
    d = {"kind": "memfd", "path": "/proc/1/fd/3", "memfd_name": None, "size": 0, "tensors": []}
    with pytest.raises(ValueError, match="must be null, null and 0"):
        validate_descriptor(d)


# ----------------------------------------------------------------------------- digest


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc = torch.nn.Linear(16, 8).to(torch.bfloat16)
        self.norm = torch.nn.BatchNorm1d(8)  # int64 num_batches_tracked, float buffers
        self.register_buffer("mask", torch.rand(8) > 0.5)


def test_digest_of_a_file_equals_the_digest_of_a_push(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    trained = _Net()
    path = tmp_path / "w.safetensors"
    save_file(trained.state_dict(), str(path))
    from_file = _Net()
    from_file.load_state_dict(load_file(str(path)))
    pushed = _round_trip(dict(trained.state_dict()))
    assert state_digest(from_file.state_dict()) == state_digest(pushed)
    assert state_digest(pushed) == state_digest(trained.state_dict())
    assert state_digest(pushed).startswith("sha256:") and len(state_digest(pushed)) == 39


def test_tied_weights_from_a_file_and_a_push_give_one_digest(tmp_path: Path) -> None:
    from safetensors.torch import load_model, save_model

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(20, 4)
            self.head = torch.nn.Linear(4, 20, bias=False)
            self.head.weight = self.emb.weight

    trained = Tied()
    path = tmp_path / "tied.safetensors"
    save_model(trained, str(path))  # stores one name of the tied pair
    loaded = Tied()
    load_model(loaded, str(path))
    pushed = _round_trip(dict(trained.state_dict()))  # both names, each a copy
    assert set(pushed) == {"emb.weight", "head.weight"}
    assert state_digest(loaded.state_dict()) == state_digest(pushed)


def test_digest_depends_on_content_only() -> None:
    base = {"b": torch.arange(12.0).reshape(3, 4), "a": torch.ones(5, dtype=torch.int32)}
    d = state_digest(base)
    assert state_digest(dict(reversed(base.items()))) == d  # dict order
    assert state_digest({"b": base["b"].t().contiguous().t(), "a": base["a"]}) == d  # strides
    assert state_digest({"b": base["b"].clone(), "a": base["a"].clone()}) == d
    assert state_digest(base, threads=1) == d


def test_digest_changes_with_any_element_name_dtype_or_shape() -> None:
    base = {"w": torch.zeros(4, 6), "b": torch.zeros(6)}
    d = state_digest(base)
    element = {"w": base["w"].clone(), "b": base["b"]}
    element["w"][3, 5] = 1e-30
    variants = {
        "element": element,
        "name": {"W": base["w"], "b": base["b"]},
        "dtype": {"w": base["w"].view(torch.int32), "b": base["b"]},  # same bytes
        "shape": {"w": base["w"].reshape(6, 4), "b": base["b"]},  # same bytes
        "moved": {"w": base["w"], "b.": base["b"]},
        "dropped": {"w": base["w"]},
    }
    digests = {k: state_digest(v) for k, v in variants.items()}
    assert d not in digests.values(), digests
    assert len(set(digests.values())) == len(digests)


def test_digest_spans_chunks_and_hashes_tied_tensors_under_both_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hotreload.worker.weights_digest as wd

    monkeypatch.setattr(wd, "CHUNK_BYTES", 1000)
    big = torch.arange(10_000, dtype=torch.float32)
    d = state_digest({"x": big})
    changed = big.clone()
    changed[-1] = 0
    assert state_digest({"x": changed}) != d
    tied = {"emb": big, "head": big}
    assert state_digest(tied) == state_digest({"emb": big, "head": big.clone()})
    assert state_digest(tied) != d


def test_digest_has_a_stable_value() -> None:
    """The format is a contract (recomputed elsewhere): a change to it must be on purpose."""
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "m": torch.tensor(True)}
    assert state_digest(state) == _reference_digest(state)


def _reference_digest(state: dict[str, torch.Tensor]) -> str:
    """The documented format, written out plainly (one chunk per tensor here)."""
    import hashlib
    import struct

    top = hashlib.sha256(b"hotreload-state-v1\0")
    for name in sorted(state):
        t = state[name]
        head = json.dumps(
            [name, str(t.dtype).removeprefix("torch."), list(t.shape), t.nbytes],
            separators=(",", ":"),
        ).encode()
        top.update(struct.pack("<I", len(head)) + head)
        top.update(hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy()).digest())
    return "sha256:" + top.hexdigest()[:32]


# ----------------------------------------------------------------------------- CUDA IPC, real

_CUDA_SENDER = textwrap.dedent(
    """
    import json, sys, torch
    from hotreload.protocol.shared_state import pack_state
    a = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    state = {"a": a, "view": a[1:, ::2], "bf": torch.full((5,), 1.5, dtype=torch.bfloat16,
             device="cuda"), "host": torch.arange(3), "empty": torch.zeros(0, device="cuda")}
    state |= {f"p{i}": torch.full((i % 50 + 1,), float(i), device="cuda") for i in range(2000)}
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    # Two packs, one per read: each IPC handle counts exactly one reader.
    packs = [pack_state(state), pack_state(state)]
    a.fill_(-1)  # the trainer's next step, before the worker reads: the push kept the bytes
    for p in packs:
        print(json.dumps(p.descriptor), flush=True)
    sys.stdin.readline()
    for p in packs:
        p.close()
    torch.cuda.ipc_collect()
    # The chunks are the trainer's again once the worker let go and the push closed.
    print("done", torch.cuda.memory_allocated() - before, flush=True)
    """
)


@pytest.mark.gpu
def test_cuda_tensors_are_read_from_another_process_by_ipc_handle() -> None:
    sender = subprocess.Popen(
        [sys.executable, "-c", _CUDA_SENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert sender.stdout is not None and sender.stdin is not None
    try:
        for_gpu, for_cpu = (json.loads(sender.stdout.readline()) for _ in range(2))
        validate_descriptor(for_gpu)
        assert for_gpu["kind"] == "mixed"
        assert len(for_gpu["chunks"]) == 1  # 2,004 CUDA tensors, one IPC handle
        assert {t["name"]: t["via"] for t in for_gpu["tensors"]}["host"] == "memfd"
        on_gpu = read_state(for_gpu, "cuda:0")
        on_cpu = read_state(for_cpu, "cpu")
        sender.stdin.write("\n")
        sender.stdin.flush()
        assert sender.stdout.readline().split() == ["done", "0"]
    finally:
        sender.stdin.close()
        sender.wait(timeout=60)
    assert sender.returncode == 0
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    expected = {
        "a": a,
        "view": a[1:, ::2],
        "bf": torch.full((5,), 1.5, dtype=torch.bfloat16),
        "host": torch.arange(3),
        "empty": torch.zeros(0),
    }
    expected |= {f"p{i}": torch.full((i % 50 + 1,), float(i)) for i in range(2000)}
    for name, want in expected.items():
        assert on_gpu[name].device.type == "cuda"
        assert _same(on_gpu[name].cpu(), want), name
        assert _same(on_cpu[name], want), name
    assert state_digest(on_gpu) == state_digest(on_cpu) == state_digest(expected)

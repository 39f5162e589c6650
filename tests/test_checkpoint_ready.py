"""A weights file still being written is seen as such (engine/checkpoint_ready.py).

Real files throughout: safetensors and `torch.save` zips cut at many points, a crafted
zip64 archive, and writer threads that grow a file while the wait runs.
"""

from __future__ import annotations

import asyncio
import io
import os
import struct
import tempfile
import threading
import time
import warnings
import zipfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as safetensors_bytes
from safetensors.torch import save_file

from hotreload.engine import checkpoint_ready
from hotreload.engine.checkpoint_ready import checkpoint_problem, wait_until_complete

STILL = "still being written"


@cache
def safetensors_blob(big: bool = True) -> bytes:
    """A real save_file output: about 3 MiB (a few KiB when not big), with metadata and an
    empty tensor (whose data_offsets are [x, x])."""
    n = 256 if big else 8
    tensors = {
        "embed.weight": torch.randn(n, 1024),
        "head.weight": torch.randn(n, 2048),
        "head.bias": torch.zeros(0),
        "steps": torch.arange(10, dtype=torch.int64),
    }
    # save_file itself, as a trainer calls it.
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "w.safetensors"
        save_file(tensors, str(path), metadata={"step": "100"})
        return path.read_bytes()


@cache
def torch_zip_blob(big: bool = True) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.randn(512 if big else 4, 1024), "n": torch.arange(3)}, buf)
    return buf.getvalue()


@cache
def torchscript_blob() -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.save(torch.jit.script(torch.nn.Linear(4, 4)), buf)
    return buf.getvalue()


@cache
def zip64_blob() -> bytes:
    """A zip whose end record defers to the zip64 one, as a zip over 4 GiB has it: the
    32-bit fields say 0xFFFFFFFF and only the zip64 record has the real offsets."""
    buf = io.BytesIO()
    saved = zipfile.ZIP64_LIMIT
    zipfile.ZIP64_LIMIT = 0  # every offset "needs" zip64: the records a huge file has
    try:
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("archive/data.pkl", b"x" * 3000)
            zf.writestr("archive/data/0", os.urandom(5000))
    finally:
        zipfile.ZIP64_LIMIT = saved
    data = bytearray(buf.getvalue())
    eocd = data.rfind(b"PK\x05\x06")
    assert data[eocd - 20 : eocd - 16] == b"PK\x06\x07"
    struct.pack_into("<HHLL", data, eocd + 8, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    # Still a valid zip for a real reader, which must now use the zip64 record.
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        assert zf.testzip() is None
        assert len(zf.namelist()) == 2
    return bytes(data)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- safetensors -------------------------------------------------------------------------


def header_len(blob: bytes) -> int:
    return struct.unpack_from("<Q", blob)[0]


@pytest.mark.parametrize("name", ["w.safetensors", "w.bin", "weights"])
def test_a_complete_safetensors_file_is_complete(tmp_path: Path, name: str) -> None:
    # By content: the same bytes under a name that does not say safetensors.
    assert checkpoint_problem(write(tmp_path / name, safetensors_blob())) is None


@pytest.mark.parametrize(
    "cut",
    [
        lambda b: 0,
        lambda b: 4,  # inside the header length
        lambda b: 8,  # the length, no header
        lambda b: 8 + header_len(b) // 2,  # mid-header
        lambda b: 8 + header_len(b),  # the header, no data
        lambda b: 8 + header_len(b) + 1000,
        lambda b: len(b) // 3,  # mid-data
        lambda b: len(b) - 1,
    ],
    ids=["empty", "mid-length", "length", "mid-header", "header", "data", "third", "last-byte"],
)
def test_a_cut_safetensors_file_is_still_being_written(
    tmp_path: Path, cut: Callable[[bytes], int]
) -> None:
    blob = safetensors_blob()
    problem = checkpoint_problem(write(tmp_path / "w.safetensors", blob[: cut(blob)]))
    assert problem is not None and problem.startswith(STILL), problem


def test_a_cut_safetensors_file_says_how_far_it_got(tmp_path: Path) -> None:
    blob = safetensors_blob()
    problem = checkpoint_problem(write(tmp_path / "w.bin", blob[: len(blob) // 2]))
    total = len(blob) / 2**20
    assert problem == f"{STILL}: {len(blob) // 2 / 2**20:.1f} of {total:.1f} MiB"


def test_a_safetensors_file_longer_than_its_header_says_so(tmp_path: Path) -> None:
    problem = checkpoint_problem(write(tmp_path / "w.safetensors", safetensors_blob() + b"junk"))
    assert problem is not None and "longer than its header says" in problem
    assert "4 bytes after the last tensor" in problem


def test_a_safetensors_header_that_is_not_json_or_lacks_offsets_is_named(tmp_path: Path) -> None:
    blob = bytearray(safetensors_blob())
    n = header_len(blob)
    bad_json = blob.copy()
    bad_json[9:12] = b"\xff\xfe!"
    problem = checkpoint_problem(write(tmp_path / "a.safetensors", bytes(bad_json)))
    assert problem == "not a valid safetensors file: its header is not valid JSON"
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}'
    no_offsets = struct.pack("<Q", len(header)) + header + b"\0" * 4
    problem = checkpoint_problem(write(tmp_path / "b.safetensors", no_offsets))
    assert problem is not None and "'w' has no valid data_offsets" in problem
    huge = struct.pack("<Q", 2**40) + bytes(blob[8 : 8 + n])
    problem = checkpoint_problem(write(tmp_path / "c.safetensors", huge))
    assert problem is not None and "implausible" in problem


# --- zip: torch.save, torch.jit.save, zip64 ----------------------------------------------


@pytest.mark.parametrize("name", ["w.pt", "w.bin", "w.ckpt", "w.safetensors"])
def test_a_complete_torch_save_zip_is_complete(tmp_path: Path, name: str) -> None:
    assert checkpoint_problem(write(tmp_path / name, torch_zip_blob())) is None


def zip_cuts(blob: bytes) -> dict[str, int]:
    """Points to cut a zip at: inside its first header, its data, and each end record."""
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        cd = zf.start_dir  # type: ignore[attr-defined]
    eocd = blob.rfind(b"PK\x05\x06")
    cuts = {"magic": 3, "header": 30, "data": len(blob) // 2, "before-cd": cd}
    cuts |= {"mid-cd": cd + 10, "before-eocd": eocd, "mid-eocd": eocd + 10}
    cuts |= {"last-byte": len(blob) - 1}
    if (locator := blob.rfind(b"PK\x06\x07")) >= 0:
        cuts |= {"zip64-record": blob.rfind(b"PK\x06\x06") + 20, "locator": locator + 8}
    return cuts


@pytest.mark.parametrize("kind", ["torch.save", "torch.jit.save", "zip64"])
def test_a_cut_zip_is_still_being_written(tmp_path: Path, kind: str) -> None:
    blob = {"torch.save": torch_zip_blob, "torch.jit.save": torchscript_blob, "zip64": zip64_blob}[
        kind
    ]()
    assert checkpoint_problem(write(tmp_path / "full.pt", blob)) is None
    for where, n in zip_cuts(blob).items():
        problem = checkpoint_problem(write(tmp_path / "cut.pt", blob[:n]))
        assert problem is not None and problem.startswith(STILL), (where, problem)


def test_torch_save_writes_its_end_record_once_and_last() -> None:
    # The fact the zip rule rests on: no end record until the very end of the file.
    blob = torch_zip_blob()
    assert blob.count(b"PK\x05\x06") == 1
    assert blob.rfind(b"PK\x05\x06") == len(blob) - 22


def test_a_zip64_end_record_is_what_counts(tmp_path: Path) -> None:
    blob = bytearray(zip64_blob())
    eocd = blob.rfind(b"PK\x05\x06")
    record = blob.rfind(b"PK\x06\x06")
    past_end = blob.copy()  # a central directory at 5 GiB: beyond this file
    struct.pack_into("<Q", past_end, record + 48, 5 << 30)
    problem = checkpoint_problem(write(tmp_path / "a.pt", bytes(past_end)))
    assert problem == "damaged zip: its central directory runs past its end record"
    no_locator = blob.copy()  # 0xFFFFFFFF fields and nothing to resolve them
    no_locator[eocd - 20 : eocd - 16] = b"XXXX"
    problem = checkpoint_problem(write(tmp_path / "b.pt", bytes(no_locator)))
    assert problem is not None and "needs a zip64 record" in problem


def test_an_end_record_signature_inside_the_comment_does_not_fool_it(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a", b"hello" * 100)
        zf.comment = b"PK\x05\x06" + b"\0" * 18 + b"PK\x05\x06 the end"
    assert checkpoint_problem(write(tmp_path / "c.zip", buf.getvalue())) is None


# --- the rest: only size stability ---------------------------------------------------------


def test_legacy_pickle_files_have_no_end_marker_to_check(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.randn(64, 64)}, buf, _use_new_zipfile_serialization=False)
    blob = buf.getvalue()
    assert checkpoint_problem(write(tmp_path / "w.pt", blob)) is None
    # Nothing in the format says where it ends: a cut one is left to the stability rule.
    assert checkpoint_problem(write(tmp_path / "cut.pt", blob[: len(blob) // 2])) is None


def test_missing_empty_and_folder(tmp_path: Path) -> None:
    assert checkpoint_problem(tmp_path / "nope.safetensors") == "missing"
    assert checkpoint_problem(write(tmp_path / "e.bin", b"")) == f"{STILL}: empty so far"
    assert checkpoint_problem(tmp_path) == "is a folder, not a file"


# --- every strict prefix is incomplete ---------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["safetensors", "torch.save", "zip64"]), data=st.data())
def test_any_strict_prefix_is_incomplete(
    tmp_path_factory: pytest.TempPathFactory, kind: str, data: st.DataObject
) -> None:
    blob = {
        "safetensors": lambda: safetensors_blob(big=False),
        "torch.save": lambda: torch_zip_blob(big=False),
        "zip64": zip64_blob,
    }[kind]()
    cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    path = write(tmp_path_factory.getbasetemp() / f"prefix.{kind}", blob[:cut])
    assert checkpoint_problem(path) is not None


DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.bool])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.dictionaries(
        st.text("abcxyz._", min_size=1, max_size=8),
        st.tuples(DTYPES, st.lists(st.integers(0, 5), max_size=3)),
        min_size=1,
        max_size=5,
    ),
    data=st.data(),
)
def test_any_safetensors_file_is_complete_and_its_prefixes_are_not(
    tmp_path_factory: pytest.TempPathFactory,
    shapes: dict[str, tuple[torch.dtype, list[int]]],
    data: st.DataObject,
) -> None:
    tensors = {k: torch.zeros(shape, dtype=dtype) for k, (dtype, shape) in shapes.items()}
    blob = safetensors_bytes(tensors)
    base = tmp_path_factory.getbasetemp()
    assert checkpoint_problem(write(base / "any.safetensors", blob)) is None
    cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    assert checkpoint_problem(write(base / "any-prefix.safetensors", blob[:cut])) is not None


# --- waiting -----------------------------------------------------------------------------


class Writer(threading.Thread):
    """Writes `blob` to `path` in `chunks` pieces, `pause` seconds apart (the first piece
    before start() returns, so the wait begins on a file that exists and is incomplete)."""

    def __init__(self, path: Path, blob: bytes, chunks: int, pause: float, prealloc: bool = False):
        super().__init__(daemon=True)
        self.blob, self.chunks, self.pause = blob, chunks, pause
        self.step = -(-len(blob) // chunks)
        # Preallocated like safetensors' own temp file (ftruncate to the full size first):
        # the size is final at once, only the mtime moves.
        # Closed by run(), which writes the rest.
        self.f = open(path, "r+b" if prealloc else "wb")  # noqa: SIM115
        if prealloc:
            self.f.truncate(len(blob))
        self.f.write(blob[: self.step])
        self.f.flush()
        self.done = threading.Event()

    def run(self) -> None:
        with self.f:
            for at in range(self.step, len(self.blob), self.step):
                time.sleep(self.pause)
                self.f.write(self.blob[at : at + self.step])
                self.f.flush()
        self.done.set()


def record() -> tuple[list[tuple[object, str]], Callable[[object, str], None]]:
    calls: list[tuple[object, str]] = []
    return calls, lambda path, problem: calls.append((path, problem))


def test_the_wait_ends_when_a_slowly_written_safetensors_file_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    writer = Writer(path, safetensors_blob(), chunks=12, pause=0.03)
    calls, on_wait = record()

    async def run() -> dict[Path, str]:
        writer.start()
        return await wait_until_complete([path], deadline_s=60, poll_s=0.01, on_wait=on_wait)

    assert asyncio.run(run()) == {}
    # The structure decides: the wait cannot end before the last byte is there.
    assert writer.done.is_set()
    assert len(calls) == 1 and calls[0][0] == path
    assert calls[0][1].startswith(STILL) and "MiB" in calls[0][1]
    writer.join()


@pytest.mark.parametrize("prealloc", [False, True], ids=["appended", "preallocated"])
def test_the_wait_outlasts_a_writer_that_only_the_stability_rule_sees(
    tmp_path: Path, prealloc: bool
) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.randn(256, 256)}, buf, _use_new_zipfile_serialization=False)
    blob = buf.getvalue() if not prealloc else safetensors_blob()
    path = tmp_path / ("w.pt" if not prealloc else "w.safetensors")
    if prealloc:  # the header first (what makes the size look right), then the data
        path.write_bytes(b"")
    writer = Writer(path, blob, chunks=10, pause=0.03, prealloc=prealloc)
    calls, on_wait = record()

    async def run() -> dict[Path, str]:
        writer.start()
        # A generous window: the writer would have to stall a whole second to fool it.
        return await wait_until_complete(
            [path], deadline_s=60, stable_s=1.0, poll_s=0.01, on_wait=on_wait
        )

    assert asyncio.run(run()) == {}
    assert writer.done.is_set()
    assert len(calls) == 1 and calls[0][1].startswith(f"{STILL}: it keeps changing")
    writer.join()


def test_a_file_never_completed_is_returned_at_the_deadline(tmp_path: Path) -> None:
    blob = safetensors_blob()
    path = write(tmp_path / "w.safetensors", blob[: len(blob) // 2])
    calls, on_wait = record()
    start = time.monotonic()
    open_ = asyncio.run(wait_until_complete([str(path)], deadline_s=0.3, on_wait=on_wait))
    assert time.monotonic() - start < 10
    assert list(open_) == [str(path)] and open_[str(path)].startswith(f"{STILL}: ")
    assert calls == [(str(path), open_[str(path)])]


def test_a_missing_file_that_appears_by_replace_ends_the_wait(tmp_path: Path) -> None:
    path = tmp_path / "w.pt"
    calls, on_wait = record()

    async def run() -> dict[Path, str]:
        async def save() -> None:
            await asyncio.sleep(0.2)
            tmp = write(tmp_path / "w.pt.tmp", torch_zip_blob())
            os.replace(tmp, path)

        task = asyncio.create_task(save())
        open_ = await wait_until_complete([path], deadline_s=60, on_wait=on_wait)
        await task
        return open_

    assert asyncio.run(run()) == {}
    assert calls == [(path, "missing")]


def test_many_paths_keep_their_keys_and_only_open_ones_come_back(tmp_path: Path) -> None:
    good = write(tmp_path / "good.safetensors", safetensors_blob())
    cut = write(tmp_path / "cut.pt", torch_zip_blob()[:5000])
    paths = [good, str(cut), good, tmp_path / "gone.bin"]
    open_ = asyncio.run(wait_until_complete(paths, deadline_s=0.2))
    assert open_ == {str(cut): checkpoint_problem(cut), tmp_path / "gone.bin": "missing"}


def test_a_zero_deadline_is_one_look(tmp_path: Path) -> None:
    good = write(tmp_path / "good.pt", torch_zip_blob())
    assert asyncio.run(wait_until_complete([good], deadline_s=0)) == {}
    cut = write(tmp_path / "cut.pt", torch_zip_blob()[:-1])
    assert list(asyncio.run(wait_until_complete([cut], deadline_s=0))) == [cut]


def test_a_hung_file_system_does_not_hang_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def hang(*args: object) -> object:
        release.wait(60)
        return []

    monkeypatch.setattr(checkpoint_ready, "_observe_all", hang)
    path = tmp_path / "w.safetensors"

    async def run() -> tuple[dict[Path, str], float]:
        start = time.monotonic()
        try:
            return await wait_until_complete([path], deadline_s=0.1), time.monotonic() - start
        finally:
            release.set()  # before asyncio.run's exit waits for the executor's threads

    open_, took = asyncio.run(run())
    assert took < checkpoint_ready.CHECK_GRACE_S + 10
    assert "could not be checked" in open_[path]


# --- the docs' advice ---------------------------------------------------------------------


def test_the_docs_atomic_saves_work_and_their_temp_files_are_ignored(tmp_path: Path) -> None:
    import safetensors.torch

    from hotreload.engine.ignore import IgnoreRules

    page = (Path(__file__).resolve().parent.parent / "docs" / "weights.md").read_text()
    section = page.split("## Checkpoints written by a trainer", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2 and "torch.save" in blocks[0] and "save_file" in blocks[1]
    model = torch.nn.Linear(3, 2)
    for block, name in zip(blocks, ["w.pt", "w.safetensors"], strict=True):
        path = str(tmp_path / name)
        exec(
            block,
            {"torch": torch, "safetensors": safetensors, "os": os, "model": model, "path": path},
        )
        assert checkpoint_problem(path) is None
        assert not os.path.exists(path + ".tmp")
        assert IgnoreRules().ignored(Path(path + ".tmp"), tmp_path)

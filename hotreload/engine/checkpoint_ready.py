"""Is a weights file complete, or is a trainer still writing it?

A trainer's `torch.save` or `save_file` straight onto the watched path fires the watcher
while the file is half written; loading it then fails ("PytorchStreamReader failed reading
zip archive: failed finding central directory") and a good checkpoint shows up as a failed
reload a few seconds before the finished file reloads fine. The reload waits here first.

Completeness is read from the file's own structure, detected by content (the suffix only
decides for a `.safetensors` file too short to show its format):

- safetensors: an 8-byte little-endian header length N, N bytes of JSON, then the tensor
  bytes; the largest `data_offsets` end says exactly how long the file must be.
- zip (`torch.save` since torch 1.6, `torch.jit.save`, `.npz`): the end of central
  directory record is written last, so a file without it is not finished. torch's writer
  (miniz) always adds the zip64 end record and locator, even for a small file.
- anything else (legacy pickled `torch.save`, raw `.bin`): nothing in the format says where
  it ends, so only "size and mtime unchanged for a while" applies.

The stability rule applies to every format, because the size can look final early:
safetensors 0.8's own `save_file` writes a `.tmpXXXXXX` file in the same folder, sets it to
its final size with ftruncate first, fills it, then renames it (so its rename is atomic, but
a writer that preallocates in place has the right size and header long before its data).

Every file is read in a few small pieces (the header, the zip tail), never whole; the
waiting side runs them in a worker thread so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from hotreload.engine.file_stamp import FileStamp

#: The safetensors format's own cap on its header (the Rust reader refuses bigger ones);
#: above it the first 8 bytes are not a safetensors header length.
SAFETENSORS_MAX_HEADER = 100_000_000
#: A check stuck on a hung file system gets at least this long past the deadline before
#: the wait gives up on it (the last check starts at the deadline and needs a moment).
CHECK_GRACE_S = 1.0

ZIP_LOCAL = b"PK\x03\x04"
ZIP_CENTRAL = b"PK\x01\x02"
ZIP_EOCD = b"PK\x05\x06"
ZIP_EOCD64 = b"PK\x06\x06"
ZIP_EOCD64_LOCATOR = b"PK\x06\x07"
EOCD_SIZE = 22
EOCD64_SIZE = 56
LOCATOR_SIZE = 20
#: The EOCD ends with a comment of at most 65535 bytes: the record lies in this tail.
ZIP_TAIL = EOCD_SIZE + 0xFFFF

P = TypeVar("P", bound=str | os.PathLike[str])


def checkpoint_problem(path: str | os.PathLike[str]) -> str | None:
    """None when the file at `path` looks complete, else a short reason ("missing",
    "still being written: 3.1 of 12.0 MiB", ...). Blocking but small: a few short reads."""
    return _inspect(path)[0]


def _inspect(path: str | os.PathLike[str]) -> tuple[str | None, FileStamp | None]:
    try:
        with open(path, "rb") as f:
            # fstat, not stat: the size must be the one of the file being read, even when
            # the path is replaced meanwhile.
            st = os.fstat(f.fileno())
            return _problem(f, st.st_size, os.fspath(path)), FileStamp.of_stat(st)
    except FileNotFoundError:
        return "missing", None
    except IsADirectoryError:
        return "is a folder, not a file", None
    except OSError as e:
        return f"cannot be read: {e.strerror or e}", None


def _problem(f: BinaryIO, size: int, name: str) -> str | None:
    if size == 0:
        # No checkpoint format is empty: this is a file just opened for writing.
        return "still being written: empty so far"
    head = f.read(9)
    # A strict prefix of the magic counts too: the first write may not be flushed whole.
    if ZIP_LOCAL.startswith(head[:4]) or head.startswith(ZIP_EOCD):
        return _zip_problem(f, size)
    if name.endswith(".safetensors") or _looks_like_safetensors(head):
        return _safetensors_problem(f, size, head)
    return None


def _looks_like_safetensors(head: bytes) -> bool:
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return 2 <= struct.unpack_from("<Q", head)[0] <= SAFETENSORS_MAX_HEADER


def _safetensors_problem(f: BinaryIO, size: int, head: bytes) -> str | None:
    if len(head) < 8:
        return f"still being written: header length incomplete ({size} of 8 bytes)"
    n = struct.unpack_from("<Q", head)[0]
    if not 2 <= n <= SAFETENSORS_MAX_HEADER:
        return f"not a safetensors file: its header length ({n}) is implausible"
    if size < 8 + n:
        return f"still being written: header {_of(size - 8, n)}"
    f.seek(8)
    raw = f.read(n)
    if len(raw) < n:  # cut short between fstat and read: a writer truncated it again
        return f"still being written: header {_of(len(raw), n)}"
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return "not a valid safetensors file: its header is not valid JSON"
    if not isinstance(header, dict):
        return "not a valid safetensors file: its header is not a JSON object"
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            return f"not a valid safetensors file: tensor {key!r} has no valid data_offsets"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        return f"still being written: {_of(size, expected)}"
    if size > expected:
        return (
            f"longer than its header says: {_amount(size)}, expected {_amount(expected)}"
            f" ({size - expected} bytes after the last tensor)"
        )
    return None


def _zip_problem(f: BinaryIO, size: int) -> str | None:
    tail_start = max(0, size - ZIP_TAIL)
    f.seek(tail_start)
    tail = f.read(size - tail_start)
    first: str | None = None
    # From the end backwards: the last record is the real one, unless a comment holds the
    # signature, in which case that candidate fails its checks and an earlier one passes.
    i = tail.rfind(ZIP_EOCD)
    while i >= 0:
        if i + EOCD_SIZE <= len(tail):
            fields = struct.unpack_from("<4s4H2LH", tail, i)
            # Bytes after the comment are tolerated, as zipfile and torch's reader do.
            if i + EOCD_SIZE + fields[7] <= len(tail):
                problem = _central_directory_problem(f, tail_start + i, fields)
                if problem is None:
                    return None
                first = first or problem
        i = tail.rfind(ZIP_EOCD, 0, i)
    # The end record is written last: without one the file is not finished (the usual
    # case), with a broken one it is damaged.
    return first or f"still being written: no zip end record yet ({_amount(size)} so far)"


def _central_directory_problem(
    f: BinaryIO, eocd_at: int, fields: tuple[bytes, int, int, int, int, int, int, int]
) -> str | None:
    entries, cd_size, cd_offset = fields[4], fields[5], fields[6]
    cd_limit = eocd_at  # the central directory must end before its end record
    locator = _read_at(f, eocd_at - LOCATOR_SIZE, LOCATOR_SIZE) if eocd_at >= 20 else b""
    if locator.startswith(ZIP_EOCD64_LOCATOR):
        record_at = struct.unpack_from("<Q", locator, 8)[0]
        if record_at + EOCD64_SIZE > eocd_at - LOCATOR_SIZE:
            return "damaged zip: its zip64 locator points past itself"
        record = _read_at(f, record_at, EOCD64_SIZE)
        if not record.startswith(ZIP_EOCD64):
            return "damaged zip: no zip64 end record where its locator points"
        entries, cd_size, cd_offset = struct.unpack_from("<3Q", record, 32)
        cd_limit = record_at
    elif 0xFFFFFFFF in (cd_size, cd_offset):
        return "damaged zip: its end record needs a zip64 record, and there is none"
    if cd_offset + cd_size > cd_limit:
        return "damaged zip: its central directory runs past its end record"
    if entries and _read_at(f, cd_offset, 4) != ZIP_CENTRAL:
        return "damaged zip: no central directory where its end record points"
    return None


def _read_at(f: BinaryIO, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _unit(total: int) -> tuple[str, int]:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if total >= scale:
            return unit, scale
    return "bytes", 1


def _of(done: int, total: int) -> str:
    """`3.1 of 12.0 MiB`: both in the unit that suits the total."""
    unit, scale = _unit(total)
    if scale == 1:
        return f"{done} of {total} bytes"
    return f"{done / scale:.1f} of {total / scale:.1f} {unit}"


def _amount(n: int) -> str:
    unit, scale = _unit(n)
    return f"{n} bytes" if scale == 1 else f"{n / scale:.1f} {unit}"


@dataclass
class _Seen:
    """One path's latest look, and since when (loop time) it has not changed."""

    problem: str | None
    signature: FileStamp | None
    since: float
    #: Its content changed while watched (not just: it was replaced by a new file).
    changed: bool = False


def _observe(
    path: str | os.PathLike[str], last: _Seen | None
) -> tuple[str | None, FileStamp | None]:
    # A stat first: while a file stays the same its verdict does too, so a complete file
    # waiting for its stability window (or for another file) costs one stat per poll.
    try:
        st = os.stat(path)
    except OSError:
        return _inspect(path)  # says "missing" or why it cannot be read
    if last is not None and last.signature == FileStamp.of_stat(st):
        return last.problem, last.signature
    return _inspect(path)


def _observe_all(paths: list[P], seen: dict[P, _Seen]) -> list[tuple[str | None, FileStamp | None]]:
    return [_observe(p, seen.get(p)) for p in paths]


async def wait_until_complete(
    paths: Iterable[P],
    *,
    deadline_s: float,
    stable_s: float = 0.1,
    poll_s: float = 0.05,
    on_wait: Callable[[P, str], None] | None = None,
) -> dict[P, str]:
    """Wait until every path is complete (`checkpoint_problem` is None) and has kept its
    size, mtime and inode for `stable_s`, all at the same time, or until `deadline_s`.

    Returns the problems still open at the deadline, keyed by the paths as given (empty:
    all complete). `on_wait(path, problem)` is called once per path, the first time it
    makes the wait longer: it has a problem, or it changes while being watched. A path
    that is complete but whose stability window the deadline cut short counts as complete
    unless it changed in the window. An exception from `on_wait` ends the wait (it is the
    caller's). Returns within `deadline_s` (plus `CHECK_GRACE_S`
    when a check hangs on the file system: its thread is then left behind).
    """
    todo = list(dict.fromkeys(paths))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(deadline_s, 0.0)
    poll_s = max(poll_s, 0.001)  # never a busy loop
    seen: dict[P, _Seen] = {}
    told: set[P] = set()
    while True:
        remaining = deadline - loop.time()
        try:
            looks = await asyncio.wait_for(
                asyncio.to_thread(_observe_all, todo, dict(seen)),
                timeout=max(remaining, CHECK_GRACE_S),
            )
        except TimeoutError:
            why = f"could not be checked within {deadline_s:g} s (a slow or hung file system?)"
            return {p: (seen[p].problem if p in seen else None) or why for p in todo}
        now = loop.time()
        for p, (problem, signature) in zip(todo, looks, strict=True):
            last = seen.get(p)
            if last is not None and last.signature == signature:
                continue
            # Same inode, new size or mtime: being written right now. A new inode is a
            # replace (the atomic save), which only restarts the stability window.
            was = last.signature if last else None
            growing = was is not None and was.same_file(signature)
            seen[p] = _Seen(problem, signature, now, growing or bool(last and last.changed))
            if growing and problem is None:
                problem = f"still being written: it keeps changing ({_size(signature)})"
            if problem is not None and on_wait is not None and p not in told:
                told.add(p)
                on_wait(p, problem)
        if all(seen[p].problem is None and now - seen[p].since >= stable_s for p in todo):
            return {}
        if now >= deadline:
            return {p: q for p in todo if (q := _open_problem(seen[p], now, stable_s))}
        await asyncio.sleep(min(poll_s, deadline - now))


def _open_problem(s: _Seen, now: float, stable_s: float) -> str | None:
    """What is still open at the deadline: a problem, or a change inside the window. A
    window the deadline cut short, with no change in it, does not hold a file back."""
    if s.problem is not None:
        return s.problem
    if now - s.since >= stable_s or not s.changed:
        return None
    return f"still being written: it changed less than {stable_s:g} s ago ({_size(s.signature)})"


def _size(signature: FileStamp | None) -> str:
    return f"{_amount(signature.size)} so far" if signature else "gone"

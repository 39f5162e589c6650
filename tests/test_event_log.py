"""events.jsonl on a full disk: said once, never a partial line, resumed when space
returns. A fake `write` plays the disk where a real small file system cannot be mounted;
as root, a real 64 KiB tmpfs fills up for real."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotreload.engine.event_kinds import BaseEvent, EventsFileError, EventsFileResumed
from hotreload.engine.events import EventBus


class FullDisk:
    """`os.write` with a switch: while `full`, a write stores only `room` bytes of what it
    is given (as a disk filling up mid-line does) and the next one fails with ENOSPC."""

    def __init__(self) -> None:
        self.full = False
        self.room = 0

    def __call__(self, fd: int, data: bytes) -> int:
        if not self.full:
            return os.write(fd, data)
        if self.room:
            n, self.room = os.write(fd, data[: self.room]), 0
            return n
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def done(bus: EventBus, version: int, trigger: str = "file") -> None:
    """A `reload_done` event (every field it requires)."""
    bus.emit(
        "reload_done",
        model="mlp",
        version=version,
        total_s=0.1,
        policy="availability",
        strategy="inplace",
        phases={"load": 0.05},
        trigger=trigger,
    )


def lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"a partial last line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]  # every line whole JSON


def test_a_full_disk_is_said_once_leaves_no_partial_line_and_writing_resumes(
    tmp_path: Path,
) -> None:
    disk = FullDisk()
    path = tmp_path / ".hotreload" / "events.jsonl"
    bus = EventBus(path, write=disk)
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    done(bus, 1)

    disk.full, disk.room = True, 17  # the next line is cut after 17 bytes
    for v in range(2, 6):
        done(bus, v)
    assert [e["version"] for e in lines(path)] == [1]
    errors = [e for e in seen if isinstance(e, EventsFileError)]
    assert len(errors) == 1 and "No space left on device" in errors[0].message

    disk.full = False  # space is back: the waiting lines follow, in order
    done(bus, 6)
    got = lines(path)
    assert [e.get("version") for e in got if e["kind"] == "reload_done"] == [1, 2, 3, 4, 5, 6]
    assert sum(isinstance(e, EventsFileResumed) for e in seen) == 1
    done(bus, 7)
    assert lines(path)[-1]["version"] == 7
    bus.close()


def test_a_long_outage_keeps_the_newest_lines_and_says_how_many_were_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hotreload.engine.events.MAX_PENDING_LINES", 3)
    disk = FullDisk()
    path = tmp_path / "events.jsonl"
    bus = EventBus(path, write=disk)
    disk.full = True
    for v in range(10):
        done(bus, v)
    disk.full = False
    done(bus, 10)
    got = lines(path)
    assert [e["version"] for e in got if e["kind"] == "reload_done"] == [8, 9, 10]
    (note,) = [e for e in got if e["kind"] == "events_file_resumed"]
    assert note["lost"] == 8 and "8 event(s) were lost" in note["message"]
    bus.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a 64 KiB tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        # Lazy: a file a failed test left open must not keep the mount (or fail teardown).
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_file_system(tiny_disk: Path) -> None:
    path = tiny_disk / ".hotreload" / "events.jsonl"
    bus = EventBus(path)
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    done(bus, 1)
    filler = tiny_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # take every byte that is left
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    for v in range(2, 40):
        done(bus, v, trigger="x" * 300)
    assert sum(isinstance(e, EventsFileError) for e in seen) == 1
    lines(path)  # whole lines only, whatever fitted
    filler.unlink()
    done(bus, 40)
    got = [e["version"] for e in lines(path) if e["kind"] == "reload_done"]
    assert got == list(range(1, 41))
    assert sum(isinstance(e, EventsFileResumed) for e in seen) == 1
    bus.close()

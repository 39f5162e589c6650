"""The event stream: every phase, outcome and error, to subscribers and to events.jsonl.

Subscribers are plain callables run on the event loop (the dashboard posts a message, the
plain printer writes a line); a subscriber that raises is dropped from nothing and logged,
because one broken consumer must not stop a reload.

events.jsonl is written one whole line at a time. A full disk (or any write error) is said
once, as an `events_file_error` event and a line on stderr; the lines that could not be
written wait in memory (the newest `MAX_PENDING_LINES`), every later event tries again, and
once a write succeeds they follow in order, after an `events_file_resumed` line saying how
many were lost. A write cut short is undone, so a reader never meets half a line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.paths import ensure_state_dir, open_private

Event = dict[str, Any]
Subscriber = Callable[[Event], None]
#: `os.write`'s shape: the one seam a test replaces to play a full disk.
Writer = Callable[[int, bytes], int]
#: Lines kept while the file cannot be written (older ones are counted, then dropped).
MAX_PENDING_LINES = 1000


class EventFile:
    """Appends whole lines to events.jsonl; keeps the ones a full disk refused."""

    def __init__(self, path: Path, write: Writer = os.write) -> None:
        ensure_state_dir(path.parent)
        self.path = path
        self._fd: int | None = open_private(path, os.O_WRONLY | os.O_APPEND)
        self._write = write
        self.pending: deque[bytes] = deque()
        #: Lines lost because the pending queue was full.
        self.lost = 0
        #: Why writing fails right now (None while it works).
        self.failing: str | None = None
        #: A cut-short line could not be undone: the next line starts on a fresh one.
        self._torn = False

    def append(self, line: bytes) -> tuple[str, str | int] | None:
        """Write `line` (and any waiting before it). Returns ("failed", why) on the write
        that starts a failure, ("resumed", lines lost) on the one that ends it, else None."""
        if self._fd is None:
            return None
        if len(self.pending) >= MAX_PENDING_LINES:
            self.pending.popleft()
            self.lost += 1
        self.pending.append(line)
        try:
            while self.pending:
                if self._torn:
                    self._write_whole(b"\n")
                    self._torn = False
                self._write_whole(self.pending[0])
                self.pending.popleft()
        except OSError as exc:
            if self.failing is None:
                self.failing = exc.strerror or str(exc)
                return ("failed", self.failing)
            return None
        if self.failing is not None:
            self.failing = None
            lost, self.lost = self.lost, 0
            return ("resumed", lost)
        return None

    def _write_whole(self, line: bytes) -> None:
        assert self._fd is not None
        start = os.fstat(self._fd).st_size
        try:
            done = self._write(self._fd, line)
            while 0 < done < len(line):
                done += self._write(self._fd, line[done:])
        except OSError:
            self._undo(start)
            raise
        if done < len(line):
            self._undo(start)
            raise OSError(28, "No space left on device (a write was cut short)")

    def _undo(self, start: int) -> None:
        """Cut the file back to where this line began: no half line is ever left."""
        assert self._fd is not None
        try:
            if os.fstat(self._fd).st_size > start:
                os.ftruncate(self._fd, start)
        except OSError:
            self._torn = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class EventBus:
    def __init__(
        self, jsonl_path: Path | None = None, keep: int = 2000, *, write: Writer = os.write
    ) -> None:
        self._subscribers: list[Subscriber] = []
        self.recent: deque[Event] = deque(maxlen=keep)
        #: What `emit_once` has said (kind and fields).
        self._said_once: set[tuple[Any, ...]] = set()
        self._file: EventFile | None = None
        if jsonl_path is not None:
            self._file = EventFile(jsonl_path, write)
            self.path = jsonl_path

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def emit_once(self, kind: str, **fields: Any) -> Event | None:
        """`emit`, unless an event of this kind with these fields was emitted before by
        `emit_once` (a note a model's every version would repeat)."""
        key = (kind, *sorted((k, repr(v)) for k, v in fields.items()))
        if key in self._said_once:
            return None
        self._said_once.add(key)
        return self.emit(kind, **fields)

    def emit(self, kind: str, **fields: Any) -> Event:
        event: Event = {"ts": time.time(), "kind": kind, **fields}
        self.recent.append(event)
        if self._file is not None:
            line = (json.dumps(event, default=str) + "\n").encode()
            change = self._file.append(line)
            if change is not None:
                self._file_changed(*change)
        self._publish(event)
        return event

    def _file_changed(self, what: str, detail: str | int) -> None:
        assert self._file is not None
        path = self._file.path
        if what == "failed":
            message = (
                f"cannot write {path}: {detail}; events are kept in memory (the newest "
                f"{MAX_PENDING_LINES}) and written when space returns"
            )
            if not self._subscribers:  # else the printer or the dashboard says it
                print(f"hotreload: {message}", file=sys.stderr)
            self._publish({"ts": time.time(), "kind": "events_file_error", "message": message})
            return
        note: Event = {"ts": time.time(), "kind": "events_file_resumed", "lost": detail}
        note["message"] = f"writing {path} again" + (
            f"; {detail} event(s) were lost while it could not be written" if detail else ""
        )
        # In the file too: a reader of it sees where lines went missing.
        self._file.append((json.dumps(note) + "\n").encode())
        self._publish(note)

    def _publish(self, event: Event) -> None:
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception as exc:
                print(f"hotreload: event subscriber {fn!r} failed: {exc}", file=sys.stderr)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

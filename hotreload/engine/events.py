"""The event stream: every phase, outcome and error, to subscribers and to events.jsonl.

Subscribers are plain callables run on the event loop (the metrics count, the plain printer
writes a line); a subscriber that raises is dropped from nothing and logged, because one
broken consumer must not stop a reload.

events.jsonl is written one whole line at a time. A full disk (or any write error) is said
once, as an `events_file_error` event and a line on stderr; the lines that could not be
written wait in memory (the newest `MAX_PENDING_LINES`), every later event tries again, and
once a write succeeds they follow in order, after an `events_file_resumed` line saying how
many were lost. A write cut short is undone, so a reader never meets half a line.

Every event is a dataclass of engine/event_kinds.py, built by `build` (an unknown kind or
field raises TypeError), carrying its time (`ts`). Subscribers receive that object and match
on its class. The dict form exists only at the edges: `as_dict` makes an events.jsonl line
(and the socket's `events` stream, commands/dashboard_ops.py), `from_dict` reads one back
(the remote dashboard, `hotreload report`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.engine.event_kinds import (
    EVENT_TYPES,
    RESERVED,
    BaseEvent,
    EventsFileError,
    EventsFileResumed,
)
from hotreload.paths import ensure_state_dir, open_private

Subscriber = Callable[[BaseEvent], None]
#: `os.write`'s shape: the one seam a test replaces to play a full disk.
Writer = Callable[[int, bytes], int]
#: Lines kept while the file cannot be written (older ones are counted, then dropped).
MAX_PENDING_LINES = 1000


# ------------------------------------------------------------------ one event, typed and serialised


def build(kind: str, fields: dict[str, Any], ts: float | None = None) -> BaseEvent:
    """The event of `kind` with `fields`, made now or at `ts`; TypeError names an unknown
    kind, a field the kind does not declare, or a required one missing."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise TypeError(
            f"unknown event kind {kind!r}: declare it in hotreload/engine/event_kinds.py"
        )
    for name in fields:
        if name not in cls.field_names:
            raise TypeError(
                f"event {kind!r} has no field {name!r} "
                f"(it has {', '.join(cls.field_names) or 'none'}); "
                "declare it in hotreload/engine/event_kinds.py"
            )
    for name in cls.field_names:
        if name in cls.required_fields and name not in fields:
            raise TypeError(f"event {kind!r} needs the field {name!r}")
    return cls(**fields) if ts is None else cls(**fields, ts=ts)


def fields_of(event: BaseEvent) -> dict[str, Any]:
    """The event's fields in declaration order, less the optional ones that are None."""
    out: dict[str, Any] = {}
    for name in event.field_names:
        value = getattr(event, name)
        if value is not None or name in event.required_fields:
            out[name] = value
    return out


def as_dict(event: BaseEvent) -> dict[str, Any]:
    """The event as events.jsonl stores it and the socket's `events` stream sends it."""
    return {"ts": event.ts, "kind": event.kind, **fields_of(event)}


def from_dict(event: dict[str, Any], *, strict: bool = True) -> BaseEvent:
    """The dataclass for an event dict (a line of events.jsonl, or of the socket's `events`
    stream), with the line's `ts` (now, if it has none). `strict=False` drops keys the kind
    does not declare (a file an older or newer hotreload wrote) and sets those it lacks to
    None, instead of raising TypeError."""
    kind = str(event.get("kind"))
    fields = {k: v for k, v in event.items() if k not in RESERVED}
    cls = EVENT_TYPES.get(kind)
    if not strict and cls is not None:
        # A reader is lenient both ways: fields it does not know go, fields the line lacks
        # (an older hotreload wrote it) are None.
        fields = {k: fields.get(k) for k in cls.field_names}
    ts = event.get("ts")
    return build(kind, fields, float(ts) if isinstance(ts, (int, float)) else None)


def typed(event: dict[str, Any]) -> BaseEvent | None:
    """The dataclass of an event dict from an edge (a line of events.jsonl, a frame of the
    socket's `events` stream), for readers to match on its class; None for a kind this
    hotreload does not know (a file or a session a newer one wrote) or fields that do not
    fit it."""
    try:
        return from_dict(event, strict=False)
    except TypeError:
        return None


# ------------------------------------------------------------------ the file and the bus


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
        self.recent: deque[BaseEvent] = deque(maxlen=keep)
        #: What `emit_once` has said (kind and fields).
        self._said_once: set[tuple[Any, ...]] = set()
        self._file: EventFile | None = None
        if jsonl_path is not None:
            self._file = EventFile(jsonl_path, write)
            self.path = jsonl_path

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def emit_once(self, kind: str | BaseEvent, **fields: Any) -> BaseEvent | None:
        """`emit`, unless an event of this kind with these fields was emitted before by
        `emit_once` (a note a model's every version would repeat)."""
        event = _typed(kind, fields)
        key = (event.kind, *sorted((k, repr(v)) for k, v in fields_of(event).items()))
        if key in self._said_once:
            return None
        self._said_once.add(key)
        return self.emit(event)

    def emit(self, kind: str | BaseEvent, **fields: Any) -> BaseEvent:
        """Build the event (`emit("ready", model=..., ...)`, or `emit(Ready(...))`), keep
        it, write it to events.jsonl and hand it to every subscriber. TypeError for a kind
        or a field that engine/event_kinds.py does not declare."""
        event = _typed(kind, fields)
        self.recent.append(event)
        if self._file is not None:
            change = self._file.append(_line(event))
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
            self._publish(EventsFileError(message=message))
            return
        message = f"writing {path} again" + (
            f"; {detail} event(s) were lost while it could not be written" if detail else ""
        )
        note = EventsFileResumed(lost=int(detail), message=message)
        # In the file too: a reader of it sees where lines went missing.
        self._file.append(_line(note))
        self._publish(note)

    def _publish(self, event: BaseEvent) -> None:
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception as exc:
                print(f"hotreload: event subscriber {fn!r} failed: {exc}", file=sys.stderr)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(event: BaseEvent) -> bytes:
    """The event's events.jsonl line (a Path or the like in a field is written as text)."""
    return (json.dumps(as_dict(event), default=str) + "\n").encode()


def _typed(kind: str | BaseEvent, fields: dict[str, Any]) -> BaseEvent:
    if isinstance(kind, BaseEvent):
        if EVENT_TYPES.get(getattr(kind, "kind", "")) is not type(kind):
            raise TypeError(f"{type(kind).__name__} is not a registered event kind")
        if fields:
            raise TypeError(f"emit({type(kind).__name__}(...)) takes no more fields: {fields}")
        return kind
    return build(kind, fields)

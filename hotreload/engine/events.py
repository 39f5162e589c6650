"""The event stream: every phase, outcome and error, to subscribers and to events.jsonl.

Subscribers are plain callables run on the event loop (the dashboard posts a message, the
plain printer writes a line); a subscriber that raises is dropped from nothing and logged,
because one broken consumer must not stop a reload.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.paths import ensure_state_dir

Event = dict[str, Any]
Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self, jsonl_path: Path | None = None, keep: int = 2000) -> None:
        self._subscribers: list[Subscriber] = []
        self.recent: deque[Event] = deque(maxlen=keep)
        self._file = None
        if jsonl_path is not None:
            ensure_state_dir(jsonl_path.parent)
            self._file = jsonl_path.open("a", encoding="utf-8", buffering=1)
            self.path = jsonl_path

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def emit(self, kind: str, **fields: Any) -> Event:
        event: Event = {"ts": time.time(), "kind": kind, **fields}
        self.recent.append(event)
        if self._file is not None:
            try:
                self._file.write(json.dumps(event, default=str) + "\n")
            except OSError as exc:  # disk full must not break a reload
                print(f"hotreload: cannot write events file: {exc}", file=sys.stderr)
                self._file = None
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception as exc:
                print(f"hotreload: event subscriber {fn!r} failed: {exc}", file=sys.stderr)
        return event

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

"""`hotreload check` in a terminal: each step shown as it starts, its time ticking, and its
result line as soon as it ends (a first load can take many seconds; a silent terminal reads
as a hang). Pipes and `--json` get the whole report at the end, as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TextIO

#: How often the running step's elapsed time is redrawn.
TICK_S = 0.1
#: Carriage return and erase-line: the ticking line is redrawn in place.
_REDRAW = "\r\033[K"


class LiveProgress:
    """Draws the running step on one line of a terminal and prints each finished one."""

    def __init__(self, out: TextIO, format_step: Callable[[Any], list[str]]) -> None:
        self.out = out
        self.format_step = format_step
        self._ticker: asyncio.Task[None] | None = None

    def model(self, name: str, policy: str, strategy: str) -> None:
        self._write(f"{name} ({policy}, {strategy})\n")

    def started(self, name: str) -> None:
        t0 = time.monotonic()

        async def tick() -> None:
            while True:
                self._write(f"{_REDRAW}  ..   {name:<10} {time.monotonic() - t0:6.1f} s")
                await asyncio.sleep(TICK_S)

        self._stop_ticker()
        self._ticker = asyncio.get_running_loop().create_task(tick())

    def finished(self, step: Any) -> None:
        self._stop_ticker()
        self._write(_REDRAW + "".join(line + "\n" for line in self.format_step(step)))

    def note(self, text: str) -> None:
        """A line said while a step runs (its ticking line is drawn again on the next tick)."""
        self._write(f"{_REDRAW}  {text}\n")

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

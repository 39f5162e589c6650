"""A streamed text request as its front end reads it: the frames the router hands on, in
order, awaited in batches.

The router calls `part` for each token frame and `done` once (the final reply or the
error); the front awaits `next()`, which gives every frame come since its last call (a
slow client's writes catch up in one write, not one per token), then [] once the final
frame was given, or raises the request's error after the frames before it. `close()` is
the front's way of saying the client went away: the router stops the request (a stream in
flight is cancelled in the worker at its next token).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hotreload.protocol.framing import Frame


class TextStream:
    """One streamed request's frames, from the router to a front end."""

    def __init__(self) -> None:
        self._frames: list[Frame] = []
        self._error: BaseException | None = None
        #: The final frame or the error came (or the front closed it).
        self._ended = False
        self._wake = asyncio.Event()
        #: Stops the request in the router (set by the router once it took the request).
        self.stop: Callable[[], None] = _nothing

    @property
    def ended(self) -> bool:
        return self._ended

    def part(self, frame: Frame) -> None:
        if not self._ended:
            self._frames.append(frame)
            self._wake.set()

    def done(self, frame: Frame | None, error: BaseException | None) -> None:
        """The router's `Done` callback: the final frame, or the error."""
        if self._ended:
            return
        self._ended = True
        if error is not None:
            self._error = error
        elif frame is not None:
            self._frames.append(frame)
        self._wake.set()

    async def next(self) -> list[Frame]:
        """The frames come since the last call (waiting for one); [] after the last."""
        while not self._frames and not self._ended:
            self._wake.clear()
            await self._wake.wait()
        if self._frames:
            out, self._frames = self._frames, []
            return out
        error, self._error = self._error, None
        if error is not None:
            raise error
        return []

    def close(self) -> None:
        """The reader is gone: stop the request unless it ended already. Idempotent."""
        if not self._ended:
            self._ended = True
            self._frames.clear()
            self._wake.set()  # a `next()` waiting gives [] (the reader is gone)
            self.stop()


def _nothing() -> None:
    """A stream the router refused at once (its error is given already): nothing to stop."""

"""The built-in load generator (`l`): a few hundred requests per second from a client in
the dashboard's own process, so queue and latency move in a demo."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from hotreload.client import AsyncClient
from hotreload.engine.signature import stand_in_inputs

#: Base requests per second over all models (waves reach 3x).
DEFAULT_RATE = 300
#: Never more than this many requests in flight from the generator: a stalled model must
#: fill its own queue, not the dashboard's memory.
MAX_OUTSTANDING = 128


def example_inputs(form: str, signature: list[dict[str, Any]]) -> Any:
    """Zeros shaped like the model's example input (batch 1; strings are "a")."""
    arrays = stand_in_inputs(signature)
    if form == "dict":
        return arrays
    if form == "tuple":
        return tuple(arrays.values())
    return next(iter(arrays.values()))


class LoadGenerator:
    """Open-loop load: requests go out on a fixed schedule whether or not replies are back,
    so a slow model shows as a growing queue, as it would with real clients."""

    def __init__(
        self,
        socket_path: str,
        targets: dict[str, tuple[str, list[dict[str, Any]]]],
        rate: float = DEFAULT_RATE,
    ) -> None:
        self.client = AsyncClient(socket_path=socket_path)
        self.inputs = {name: example_inputs(*t) for name, t in targets.items()}
        self.rate = rate
        self.sent = 0
        self.errors = 0
        self._outstanding: set[asyncio.Task[None]] = set()

    async def _one(self, model: str) -> None:
        try:
            await self.client.infer(model, self.inputs[model], timeout_s=10)
        except Exception:
            self.errors += 1  # rejections and timeouts show in the Queue panel's counters

    async def run(self) -> None:
        if not self.inputs:
            return
        names = list(self.inputs)
        tick = 0.01
        due = 0.0
        start = last = time.monotonic()
        try:
            while True:
                await asyncio.sleep(tick)
                now = time.monotonic()
                # Waves over 20 s, peaking at 3x the base rate: a burst above what the model
                # serves fills the queue, which then drains; that is what the demo is for.
                swing = 1.0 + 2.0 * max(0.0, math.sin((now - start) * 2 * math.pi / 20.0))
                due += (now - last) * self.rate * swing
                last = now
                while due >= 1:
                    due -= 1
                    if len(self._outstanding) >= MAX_OUTSTANDING:
                        continue
                    task = asyncio.create_task(self._one(names[self.sent % len(names)]))
                    self._outstanding.add(task)
                    task.add_done_callback(self._outstanding.discard)
                    self.sent += 1
        finally:
            for task in list(self._outstanding):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._outstanding, return_exceptions=True)
            await self.client.close()

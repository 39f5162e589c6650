"""Requests parked for a version (`min_version`) are bounded in count and bytes like the
queue (issue 30, item 7): past either they are refused at once, never held."""

from __future__ import annotations

import asyncio
from typing import Any

from hotreload.engine.router import ModelRouter
from hotreload.errors import QueueFullError


def submit(r: ModelRouter, out: list[Any], nbytes: int, min_version: int = 1) -> None:
    meta = {"name": "x", "dtype": "uint8", "shape": [nbytes], "nbytes": nbytes}
    r.submit(
        {"tensors": [meta], "form": "single", "min_version": min_version},
        bytes(nbytes),
        lambda f, e: out.append(e),
    )


def test_parked_requests_count_against_the_queue_bound() -> None:
    async def run() -> None:
        r = ModelRouter(name="m", max_queue_size=4, request_timeout_s=30, max_inflight=4)
        out: list[Any] = []
        for _ in range(6):
            submit(r, out, 16)
        assert r.snapshot()["waiting_for_version"] == 4
        assert len(out) == 2 and all(isinstance(e, QueueFullError) for e in out)
        assert "4 requests wait (limit 4" in str(out[0])
        r.fail_queued(QueueFullError("stop"))

    asyncio.run(asyncio.wait_for(run(), 30))


def test_parked_requests_are_bounded_in_bytes() -> None:
    async def run() -> None:
        r = ModelRouter(
            name="m",
            max_queue_size=100,
            request_timeout_s=30,
            max_inflight=4,
            max_parked_bytes=1000,
        )
        out: list[Any] = []
        submit(r, out, 600)
        submit(r, out, 600)
        submit(r, out, 300)
        assert r.snapshot()["waiting_for_version"] == 2
        assert len(out) == 1 and "pass the 1000-byte limit" in str(out[0])
        r.serving_version(1)  # they leave the parking: their bytes with them
        submit(r, out, 900, min_version=2)
        assert r.snapshot()["waiting_for_version"] == 1 and len(out) == 1
        r.fail_queued(QueueFullError("stop"))

    asyncio.run(asyncio.wait_for(run(), 30))

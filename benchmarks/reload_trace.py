"""How a reload reads: the manager-side calls of one file-edit reload and one push, traced.

A supervisor over the scripted fake worker (tests/supervisor/fake_worker.py) starts, then
runs one reload triggered by a file edit and one push of weights. Every Python call made
inside the `hotreload` package during each of them is recorded; the figures are

  cross-file calls   a function in one file calling a function in another
  files              how many files of the package the job went through
  returns            cross-file calls into a file the job had already been in: each one is
                     a place where the reader, following the job top to bottom, has to go
                     back to a file read before (a "bounce")

Run it as `python benchmarks/reload_trace.py` (add `--calls` to list every cross-file
call). It is a tool for reading the code, no longer a test: a count held by a test shaped
the code to fit it (issue 39).
The counts depend only on the code, never on timing: the fake worker answers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PACKAGE = str(ROOT / "hotreload") + "/"


@dataclass
class Trace:
    """The cross-file calls of one job, in order, as (caller file, callee file, function)."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def files(self) -> set[str]:
        return {f for c in self.calls for f in c[:2]}

    @property
    def returns(self) -> int:
        return _returns(self.calls)

    @property
    def steps(self) -> list[tuple[str, str, str]]:
        """The calls less those into the event bus: a sink that never calls back into a
        job (each phase's start and end is one emit each)."""
        return [c for c in self.calls if c[1] != SINK]


#: The event bus (engine/events.py): every emit is a call into it.
SINK = "engine/events.py"


def _returns(calls: list[tuple[str, str, str]]) -> int:
    seen: set[str] = set()
    n = 0
    for caller, callee, _ in calls:
        seen.add(caller)
        if callee in seen:
            n += 1
        seen.add(callee)
    return n


def _short(path: str) -> str:
    return path[len(PACKAGE) :]


def traced(fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Trace]]:
    """`fn` run with a profiler recording cross-file calls inside the package. A coroutine
    resumed after an await is not a call (its frame was entered before)."""

    async def run() -> Trace:
        trace = Trace()
        # The frames seen, held so that no new frame can take a dead one's id: a coroutine's
        # frame is "called" again each time it resumes after an await.
        entered: dict[int, FrameType] = {}

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event != "call":
                return
            code = frame.f_code
            callee = code.co_filename
            if not callee.startswith(PACKAGE):
                return
            if entered.get(id(frame)) is frame:
                return  # a coroutine or generator resumed, not called
            entered[id(frame)] = frame
            caller = frame.f_back
            # The nearest caller inside the package (a call through asyncio's machinery
            # counts from the task that awaited it).
            while caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
                caller = caller.f_back
            if caller is None:
                return
            src = caller.f_code.co_filename
            if src != callee:
                trace.calls.append((_short(src), _short(callee), code.co_qualname))

        sys.setprofile(profile)
        try:
            await fn()
        finally:
            sys.setprofile(None)
        return trace

    return run


async def measure() -> dict[str, Trace]:
    import numpy as np

    from hotreload.config import load_config
    from hotreload.engine.events import EventBus
    from hotreload.engine.locks import DeviceLocks
    from hotreload.engine.model import ModelSupervisor
    from hotreload.protocol.shared_state import pack_state
    from tests.supervisor.fake_worker import FakeWorker, Script
    from tests.support import make_project

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        config = load_config(make_project(tmp_path))
        model = dataclasses.replace(config.models[0], device="cpu")
        script = Script()
        sup = ModelSupervisor(
            model,
            config,
            EventBus(None),
            DeviceLocks(tmp_path / "locks"),
            spawn=lambda generation, code, standby: FakeWorker(script, generation),
            snapshot_dir=tmp_path / "snapshots",
        )
        try:
            await sup.start()

            async def file_edit() -> None:
                outcome = await sup.reload("file", ["model.py"], force=True)  # no edit made
                assert outcome.ok, outcome.error

            state = {"weight": np.ones((4, 4), np.float32)}
            packed = pack_state(state)

            async def push() -> None:
                await sup.push(packed.descriptor, strict=False)

            traces = {
                "file edit": await traced(file_edit)(),
                "push": await traced(push)(),
            }
            packed.close()
            return traces
        finally:
            await sup.stop(drain_timeout_s=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="list every cross-file call")
    parser.add_argument("--json", action="store_true", help="the calls of each job, as JSON")
    args = parser.parse_args()
    traces = asyncio.run(measure())
    if args.json:
        print(json.dumps({name: trace.calls for name, trace in traces.items()}))
        return
    print(
        f"{'job':<10} {'cross-file calls':>16} {'files':>6} {'returns':>8}"
        f" {'calls w/o emits':>16} {'returns w/o emits':>18}"
    )
    for name, trace in traces.items():
        print(
            f"{name:<10} {len(trace.calls):>16} {len(trace.files):>6} {trace.returns:>8}"
            f" {len(trace.steps):>16} {_returns(trace.steps):>18}"
        )
    if args.calls:
        for name, trace in traces.items():
            print(f"\n{name}:")
            for caller, callee, fn in trace.calls:
                print(f"  {caller} -> {callee}  {fn}")


if __name__ == "__main__":
    main()

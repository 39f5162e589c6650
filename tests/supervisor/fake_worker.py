"""A scripted worker at the ops seam (protocol/ops.py), for stepping a supervisor in-process.

It answers each op the way `worker/server.py` does, at once by default. A test can hold an
op (`script.hold(WorkerOp.LOAD)`: the request waits until `script.release(...)`), wait for
it to start (`await script.started(WorkerOp.LOAD)`), make it fail with an error reply, kill
a worker (`worker.die()`), or hang its forwards. Everything a worker was asked is logged in
`script.log` as (pid, op) in order.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hotreload.engine.worker_proc import WorkerDied, WorkerReplyError
from hotreload.protocol.framing import Frame
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.replies import LoadReply, SmokeReply, SyncReply, WarmReply

INPUTS = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]
OUTPUTS = [{"name": "output", "dtype": "float32", "shape": [1, 4]}]
_pids = itertools.count(40_000)


class Script:
    """What every fake worker of one test does."""

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []
        self.workers: list[FakeWorker] = []
        self._holds: dict[str, asyncio.Event] = {}
        self._started: dict[str, asyncio.Event] = {}
        #: op -> the error reply the next request for it gets (once).
        self.fail_next: dict[str, dict[str, Any]] = {}
        #: Workers (pids) whose forwards never answer (a kernel that never returns).
        self.hung: set[int] = set()
        #: The project files each LOAD reports as imported (LoadReply.imports).
        self.imports: list[str] = []

    def hold(self, op: str) -> None:
        """The next requests for `op` wait for `release`; `started` waits for the next one."""
        self._holds[op] = asyncio.Event()
        self._started[op] = asyncio.Event()

    def release(self, op: str) -> None:
        self._holds.pop(op).set()

    async def started(self, op: str, timeout_s: float = 10.0) -> None:
        await asyncio.wait_for(self._event(op).wait(), timeout_s)

    def _event(self, op: str) -> asyncio.Event:
        return self._started.setdefault(op, asyncio.Event())

    def ops(self, pid: int | None = None) -> list[str]:
        return [op for p, op in self.log if pid is None or p == pid]

    async def answer(self, worker: FakeWorker, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        self.log.append((worker.pid, op))
        self._event(op).set()
        gate = self._holds.get(op)
        if gate is not None:
            await worker.unless_dead(gate.wait())
        if op in self.fail_next:
            raise WorkerReplyError(self.fail_next.pop(op))
        # The replies the real worker builds (protocol/replies.py), as the wire carries them.
        if op == WorkerOp.LOAD:
            worker.staged = int(fields["version"])
            reply = LoadReply(0.001, 0, INPUTS, "single", reimported=1, imports=self.imports)
            return reply.wire()
        if op == WorkerOp.WARM:
            return WarmReply(0.001, [1.0]).wire()
        if op == WorkerOp.SMOKE:
            return SmokeReply(OUTPUTS).wire()
        if op == WorkerOp.SWAP:
            worker.version, worker.staged = worker.staged, None
            sync = SyncReply(skipped=True, reason="cpu").wire()
            return {"sync": sync} if fields.get("inband") else {}
        if op == WorkerOp.SYNC:
            return SyncReply(skipped=True, reason="no CUDA streams on the CPU").wire()
        return {}


class FakeWorker:
    """The part of `WorkerProcess` a supervisor and its router use."""

    def __init__(self, script: Script, generation: int) -> None:
        self.script = script
        self.generation = generation
        self.pid = next(_pids)
        self.device = "cpu"
        self.recycled = 0
        self.build_cpus: frozenset[int] | None = None
        self.exit_reason: str | None = None
        self.on_death: Any = None
        self.version: int | None = None
        self.staged: int | None = None
        self.dead = asyncio.Event()
        self._started = False
        self._forwards: list[Any] = []
        script.workers.append(self)

    @property
    def alive(self) -> bool:
        return self._started and not self.dead.is_set()

    async def start(self, timeout_s: float) -> None:
        await self.script.answer(self, "start", {})
        self._started = True

    async def request(self, op: WorkerOp, timeout_s: float | None = None, **fields: Any) -> Any:
        if not self.alive:
            raise WorkerDied(self.exit_reason or "worker is not running")
        call = self.unless_dead(self.script.answer(self, str(op), fields))
        reply = await (asyncio.wait_for(call, timeout_s) if timeout_s else call)
        return {"ok": True, **reply}

    async def unless_dead(self, aw: Any) -> Any:
        """Await `aw`; WorkerDied if the worker dies first."""
        task = asyncio.ensure_future(aw)
        death = asyncio.ensure_future(self.dead.wait())
        try:
            await asyncio.wait([task, death], return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
        if not task.done():
            task.cancel()
            raise WorkerDied(self.exit_reason or "worker died")
        return task.result()

    def send_with_callback(self, header: dict[str, Any], blobs: Any, waiter: Any) -> bool:
        if not self.alive:
            return False
        self.script.log.append((self.pid, str(header["op"])))
        if self.pid in self.script.hung:
            self._forwards.append(waiter)
        else:
            frame = Frame({"ok": True, "version": self.version, "tensors": []}, b"")
            asyncio.get_running_loop().call_soon(waiter, frame, None)
        return True

    def memory_limit(self) -> None:
        return None

    def die(self, reason: str = "killed by signal 9") -> None:
        """The process went away on its own (a segfault, the OOM killer)."""
        self._end(reason)
        if self.on_death is not None:
            self.on_death(self)

    def _end(self, reason: str) -> None:
        if self.dead.is_set():
            return
        self.exit_reason = reason
        self.dead.set()
        for waiter in self._forwards:
            waiter(None, WorkerDied(reason))
        self._forwards.clear()

    async def stop(self, timeout_s: float) -> None:
        self.script.log.append((self.pid, "stop"))
        self._end("stopped")

    async def kill(self) -> None:
        self.script.log.append((self.pid, "kill"))
        self._end("killed")

"""A scripted worker at the port (engine/worker_port.py), for stepping a supervisor in-process.

It implements `Worker` as the real process does: each op takes its request dataclass and
answers its reply dataclass (protocol/messages.py), the way `worker/server.py` does, at once
by default; every reply goes through its wire form and back, as the real one does.

A test can hold an op (`script.hold(WorkerOp.LOAD)`: the request waits until
`script.release(...)`), wait for it to start (`await script.started(WorkerOp.LOAD)`), make
it fail with an error reply, kill a worker (`worker.die()`), or hang its forwards.
Everything a worker was asked is logged in `script.log` as (pid, op) in order.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hotreload.engine.worker_port import R, Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import (
    DigestReply,
    Done,
    FreedReply,
    LoadReply,
    LoadRequest,
    Reply,
    Request,
    RestoreReply,
    SmokeReply,
    StatusReply,
    SwapReply,
    SwapRequest,
    SyncReply,
    WarmReply,
)
from hotreload.protocol.ops import WorkerOp

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

    async def gate(self, worker: FakeWorker, op: str) -> None:
        """Log `op`, hold it while the test says so, fail it once when told to."""
        self.log.append((worker.pid, op))
        self._event(op).set()
        gate = self._holds.get(op)
        if gate is not None:
            await worker.unless_dead(gate.wait())
        if op in self.fail_next:
            raise WorkerReplyError(self.fail_next.pop(op))

    def answer(self, worker: FakeWorker, request: Request[Any]) -> Reply:
        """What the real worker answers to `request`, with the fake's figures."""
        op = request.op
        if isinstance(request, LoadRequest):
            worker.staged = request.version
            return LoadReply(0.001, 0, INPUTS, "single", reimported=1, imports=self.imports)
        if op == WorkerOp.WARM:
            return WarmReply(0.001, [1.0])
        if op == WorkerOp.SMOKE:
            return SmokeReply(OUTPUTS)
        if isinstance(request, SwapRequest):
            if worker.staged is None:
                raise WorkerReplyError({"message": "swap asked for but no version is staged"})
            worker.version, worker.staged = worker.staged, None
            sync = SyncReply(skipped=True, reason="cpu") if request.inband else None
            return SwapReply(worker.version, sync)
        if op == WorkerOp.SYNC:
            return SyncReply(skipped=True, reason="no CUDA streams on the CPU")
        if op in (WorkerOp.RELEASE, WorkerOp.RETIRE):
            if op == WorkerOp.RETIRE:
                worker.version = worker.staged = None
            return FreedReply(0)
        if op == WorkerOp.RESTORE:
            worker.version = worker.offloaded
            return RestoreReply(worker.version or 0)
        if op == WorkerOp.OFFLOAD:
            worker.offloaded, worker.version = worker.version, None
            return Done()
        if op == WorkerOp.STATUS:
            return StatusReply("serving", worker.pid, "cpu", 1 << 20, version=worker.version)
        if op == WorkerOp.DIGEST:
            return DigestReply(f"sha256:{worker.version or 0:064x}", hashed_bytes=0)
        return Done()  # PING, SHUTDOWN


class FakeWorker(Worker):
    """A worker process, played by the script."""

    def __init__(self, script: Script, generation: int) -> None:
        super().__init__()
        self.script = script
        self.generation = generation
        self.pid = next(_pids)
        self.device = "cpu"
        self.recycled = 0
        self.build_cpus: frozenset[int] | None = None
        self.exit_reason: str | None = None
        self.preimport: tuple[str, ...] = ()
        self.version: int | None = None
        self.staged: int | None = None
        self.offloaded: int | None = None
        self.dead = asyncio.Event()
        self._started = False
        self._forwards: list[Any] = []
        script.workers.append(self)

    @property
    def alive(self) -> bool:
        return self._started and not self.dead.is_set()

    async def start(self, timeout_s: float) -> None:
        await self.script.gate(self, "start")
        self._started = True

    async def call(self, request: Request[R], timeout_s: float | None = None) -> R:
        if not self.alive:
            raise WorkerDied(self.exit_reason or "worker is not running")
        # As the real worker reads it: a request that does not survive its wire form fails.
        request = type(request).from_wire(request.wire())
        call = self.unless_dead(self.script.gate(self, str(request.op)))
        await (asyncio.wait_for(call, timeout_s) if timeout_s else call)
        reply = self.script.answer(self, request)
        return request.reply.from_wire(reply.wire())  # type: ignore[return-value]

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

    def submit(self, header: dict[str, Any], blobs: Any, waiter: Any) -> bool:
        if not self.alive:
            return False
        self.script.log.append((self.pid, str(header["op"])))
        if self.pid in self.script.hung:
            self._forwards.append(waiter)
        else:
            frame = Frame({"ok": True, "version": self.version, "tensors": []}, b"")
            asyncio.get_running_loop().call_soon(waiter, frame, None)
        return True

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

    async def end(self, grace_s: float = 0.0) -> None:
        if self.dead.is_set():
            return  # idempotent, as the real one is
        self.script.log.append((self.pid, "stop" if grace_s > 0 else "kill"))
        self._end("stopped" if grace_s > 0 else "killed")

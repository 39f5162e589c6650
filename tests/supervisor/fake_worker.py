"""A scripted worker at the port (engine/worker_port.py), for stepping a supervisor in-process.

It implements `Worker` as the real process does: each op takes its request dataclass and
answers its reply dataclass (protocol/messages.py), the way `worker/server.py` does, at once
by default; every reply goes through its wire form and back, as the real one does.

A test can hold an op (`script.hold(WorkerOp.LOAD)`: the request waits until
`script.release(...)`), wait for it to start (`await script.started(WorkerOp.LOAD)`), make
it fail with an error reply, kill a worker (`worker.die()`), or hang its forwards.
Everything a worker was asked is logged in `script.log` as (pid, op) in order.

A streamed `text` request is answered as the real worker does: one `PARTIAL` frame per
token (`t0 `, `t1 `, ...) naming the version that started it, then the final reply, or a
`cancelled` error at the next token after a CANCEL; one not streamed decodes the same way,
sending only its reply (a CANCEL stops it too). Streams and in-band swaps keep the
serving thread's order: each starts once those sent before it ended. `script.hold_streams()`
stops every stream after its first token until `script.release_streams()`.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from hotreload.engine import golden
from hotreload.engine.golden import GoldenSet
from hotreload.engine.worker_port import R, Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import (
    CANCELLED,
    PARTIAL,
    CancelRequest,
    DigestReply,
    Done,
    EvalReply,
    EvalRequest,
    FreedReply,
    LoadReply,
    LoadRequest,
    Reply,
    Request,
    RestoreReply,
    SaveReply,
    SaveRequest,
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
        #: Seconds between a stream's tokens, and the gate `hold_streams` closes.
        self.stream_step_s = 0.001
        self._streams_go: asyncio.Event | None = None
        #: The served signatures each WARM was asked to replay (WarmRequest.shapes), and
        #: the compile figures its reply carries (WarmReply.compile).
        self.warm_shapes: list[list[Any]] = []
        self.warm_compile: dict[str, Any] | None = None
        #: What STATUS says of requests that compiled on the serving path.
        self.serving_compiles = 0
        #: The golden outputs the next SMOKE replies carry, in order (sent in the wire
        #: form, their bytes as the payload, as the real worker does); none left: none.
        self.goldens: list[GoldenSet] = []
        #: Every LOAD asked, in order (its code paths, weights plan and pushes).
        self.loads: list[LoadRequest] = []
        #: Every SAVE asked (`hotreload save`).
        self.saves: list[SaveRequest] = []
        #: What the next EVALs answer, in order: figures, or an error reply's fields. None
        #: left: the real worker's answer to a model with no `eval`.
        self.evals: list[dict[str, Any]] = []

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

    def hold_streams(self) -> None:
        """Streams stop after their first token (a CANCEL still stops them)."""
        self._streams_go = asyncio.Event()

    def release_streams(self) -> None:
        if self._streams_go is not None:
            self._streams_go.set()
        self._streams_go = None

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
            self.loads.append(request)
            worker.staged = request.version
            return LoadReply(0.001, 0, INPUTS, "single", reimported=1, imports=self.imports)
        if op == WorkerOp.WARM:
            shapes = getattr(request, "shapes", [])
            self.warm_shapes.append(list(shapes))
            return WarmReply(0.001, [1.0], replayed=len(shapes), compile=self.warm_compile)
        if op == WorkerOp.SMOKE:
            if not self.goldens:
                return SmokeReply(OUTPUTS)
            wire, blobs = golden.to_wire(self.goldens.pop(0))
            return SmokeReply(OUTPUTS, golden=wire, payload=b"".join(bytes(b) for b in blobs))
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
        if isinstance(request, CancelRequest):
            running = worker.streams.get(request.target)
            if running is not None:
                running.cancel.set()
            return Done()
        if op == WorkerOp.STATUS:
            return StatusReply(
                "serving",
                worker.pid,
                "cpu",
                1 << 20,
                version=worker.version,
                cancelled=worker.cancelled,
                serving_compiles=self.serving_compiles,
            )
        if op == WorkerOp.DIGEST:
            return DigestReply(f"sha256:{worker.version or 0:064x}", hashed_bytes=0)
        if isinstance(request, EvalRequest):
            if not self.evals:
                raise WorkerReplyError({"message": "no `eval` is configured for this model"})
            answer = self.evals.pop(0)
            if "message" in answer:
                raise WorkerReplyError(answer)
            return EvalReply(request.version, answer, 0.001)
        if isinstance(request, SaveRequest):
            self.saves.append(request)
            if worker.version is None:
                raise WorkerReplyError({"message": "no version serves: nothing to save"})
            return SaveReply(["model.safetensors", "hotreload.json"], 1, 16)
        return Done()  # PING, SHUTDOWN


@dataclass(eq=False)
class FakeStream:
    """One streamed request in a fake worker: its CANCEL flag and its end."""

    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    waiter: Any = None
    task: asyncio.Future[None] | None = None


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
        self._ids = itertools.count(1)
        #: Streamed requests running or waiting their turn, by id.
        self.streams: dict[int, FakeStream] = {}
        self.cancelled = 0
        #: The serving thread's line: what a stream or in-band swap waits for (its end).
        self._line: list[asyncio.Event] = []
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
        if isinstance(request, SwapRequest) and request.inband:
            # On the serving thread, behind the streams sent before it (taken in line at
            # once, as the frame's send is, before this call first waits).
            ahead, mine = self._take_turn()
            try:
                turn = self.unless_dead(asyncio.gather(*(e.wait() for e in ahead)))
                await (asyncio.wait_for(turn, timeout_s) if timeout_s else turn)
                return await self._answer(request, timeout_s)
            finally:
                mine.set()
        return await self._answer(request, timeout_s)

    async def _answer(self, request: Request[R], timeout_s: float | None) -> R:
        call = self.unless_dead(self.script.gate(self, str(request.op)))
        await (asyncio.wait_for(call, timeout_s) if timeout_s else call)
        reply = self.script.answer(self, request)
        header = reply.wire()
        if getattr(reply, "payload", None):  # bytes beside the header, as WorkerProcess.call
            header["payload"] = memoryview(reply.payload)  # type: ignore[attr-defined]
        return request.reply.from_wire(header)  # type: ignore[return-value]

    def _take_turn(self) -> tuple[list[asyncio.Event], asyncio.Event]:
        """A place in the serving thread's line: the ends to wait for, and its own."""
        self._line = [e for e in self._line if not e.is_set()]
        ahead, mine = list(self._line), asyncio.Event()
        self._line.append(mine)
        return ahead, mine

    async def unless_dead(self, aw: Any) -> Any:
        """Await `aw`; WorkerDied if the worker dies first."""
        task = asyncio.ensure_future(aw)
        death = asyncio.ensure_future(self.dead.wait())
        try:
            await asyncio.wait([task, death], return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
            if not task.done():
                # Left behind (the worker died, or the caller gave up): its end is read
                # here, or asyncio logs it as never retrieved, a traceback formatted in
                # whichever allocation's garbage collection finalizes it (under Python 3.11,
                # inside another ast.parse: a SystemError there).
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if not task.done():
            task.cancel()
            raise WorkerDied(self.exit_reason or "worker died")
        return task.result()

    def submit(self, header: dict[str, Any], blobs: Any, waiter: Any) -> bool:
        if not self.alive:
            return False
        header["id"] = rid = next(self._ids)
        self.script.log.append((self.pid, str(header["op"])))
        text = header.get("text") or {}
        if self.pid in self.script.hung:
            self._forwards.append(waiter)
        elif header["op"] == WorkerOp.TEXT:
            # Streamed or not, a text request decodes token by token on the serving line
            # and stops at a CANCEL (only a stream sends its tokens as they come).
            running = self.streams[rid] = FakeStream(waiter=waiter)
            ahead, mine = self._take_turn()
            running.task = asyncio.ensure_future(self._stream(rid, text, running, ahead, mine))
        else:
            frame = Frame({"ok": True, "version": self.version, "tensors": []}, b"")
            asyncio.get_running_loop().call_soon(waiter, frame, None)
        return True

    async def _stream(
        self,
        rid: int,
        text: dict[str, Any],
        running: FakeStream,
        ahead: list[asyncio.Event],
        mine: asyncio.Event,
    ) -> None:
        """The serving thread's decode of one streamed request, a token per step."""
        try:
            await asyncio.gather(*(e.wait() for e in ahead))
            version = self.version  # the version serving when its turn came: all of it
            digest = f"sha256:{version or 0:064x}"
            # None: a chat without max_tokens (the real worker: the rest of the context).
            n = int((text.get("sampling") or {}).get("max_tokens") or 16)
            made = ""
            for i in range(n):
                if i:
                    await self._step(running)
                if running.cancel.is_set():
                    self.cancelled += 1
                    error = {"code": CANCELLED, "message": f"stream cancelled after {i} token(s)"}
                    running.waiter(Frame({"id": rid, "ok": False, "error": error}, b""), None)
                    return
                piece = f"t{i} "
                made += piece
                if not text.get("stream"):
                    continue
                head = {"id": rid, "ok": True, PARTIAL: True, "version": version}
                choices = [{"index": 0, "text": piece}]
                running.waiter(Frame({**head, "digest": digest, "choices": choices}, b""), None)
            choice = {"index": 0, "text": made, "logprobs": None, "finish_reason": "length"}
            usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            final = {"id": rid, "ok": True, "version": version, "digest": digest}
            reply = {**final, "choices": [choice], "usage": usage, "compute_ms": 0.0}
            running.waiter(Frame(reply, b""), None)
        finally:
            self.streams.pop(rid, None)
            running.ended.set()
            mine.set()

    async def _step(self, running: FakeStream) -> None:
        """The time a token takes; while streams are held, until released or cancelled."""
        await asyncio.sleep(self.script.stream_step_s)
        go = self.script._streams_go
        if go is not None and not running.cancel.is_set():
            waits = [asyncio.ensure_future(go.wait()), asyncio.ensure_future(running.cancel.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

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
        for running in list(self.streams.values()):  # the process took them with it
            if running.task is not None:
                running.task.cancel()
            running.waiter(None, WorkerDied(reason))
        self.streams.clear()

    async def end(self, grace_s: float = 0.0) -> None:
        if self.dead.is_set():
            return  # idempotent, as the real one is
        self.script.log.append((self.pid, "stop" if grace_s > 0 else "kill"))
        self._end("stopped" if grace_s > 0 else "killed")

"""A handle on one worker process: spawn it, talk to it, stop it.

The worker is a fresh interpreter (`python -m hotreload.worker`, fork+exec, so nothing of
this process's state, CUDA included, is inherited). The control channel is one end of a
socketpair passed as an inherited descriptor: no path to guess, no other process can
connect. Requests are multiplexed by id, so infer and control traffic share the channel;
a streamed text request is answered by several frames with its id (`PARTIAL`, then the
final one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.engine.memory_limits import (
    CgroupMemory,
    cgroup_memory,
    cgroups_of,
    describe_oom_kill,
    oom_kills,
    peak_rss_bytes,
    rss_bytes,
)
from hotreload.engine.worker_port import (
    R,
    ReplyCallback,
    Worker,
    WorkerDied,
    WorkerReplyError,
)
from hotreload.errors import ProtocolError
from hotreload.protocol.frame_protocol import FrameProtocol
from hotreload.protocol.framing import SPILLED_HEADER, Frame, pack_frame, unspill
from hotreload.protocol.messages import PARTIAL, Request, ShutdownRequest
from hotreload.worker.launch import FD_ENV, SPEC_ENV

#: How often a worker's RSS and the machine's OOM-kill count are read, so a kill by the
#: kernel's OOM killer can be told apart from another SIGKILL and its last RSS named.
MEMORY_SAMPLE_S = 0.5
#: After the channel closes, how long the exit status may take before pending requests
#: fail without it (it comes within milliseconds when the process died).
EXIT_AFTER_EOF_S = 0.5


def worker_spec(
    model: ModelConfig, config: Config, code: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a worker needs to know, as JSON (the worker never reads the config file).

    `code` overrides the path fields (root, entry, example, weights, watch), e.g. to start a
    worker on the last good snapshot instead of the files on disk.
    """
    spec = {
        "name": model.name,
        "root": str(config.root),
        "entry": model.entry.to_wire(),
        "example": model.example.to_wire(),
        "weights": [str(p) for p in model.weights],
        "weights_prefix": model.weights_prefix.to_wire() if model.weights_prefix else None,
        "device": model.device,
        "warmup_iters": model.warmup_iters,
        "threads": (
            {"intra_op": model.threads.intra_op, "inter_op": model.threads.inter_op}
            if model.threads
            else None
        ),
        "env": dict(model.env),
        "allow_output_change": model.allow_output_change,
        # The smoke test runs them (worker/golden_run.py): prompts, for a generator.
        "golden": model.golden.to_wire() if model.golden else None,
        # Each new version is scored with it once it serves (worker/eval_run.py).
        "eval": model.eval.to_wire() if model.eval else None,
        "generator": model.generator,
        "build_pace": model.build_pace,
        # respawn: weights read from the files go into a block the next worker can map.
        "shared_weights": model.strategy == "respawn",
        "expected_output": dict(model.expected_output) if model.expected_output else None,
        "max_frame_bytes": config.max_frame_bytes,
        "watch": [str(p) for p in model.watch],
        "shapes": {k: list(v) for k, v in model.shapes.items()},
        "tokenizer": str(model.tokenizer) if model.tokenizer else None,
        "max_prompt_tokens": model.max_prompt_tokens,
        "adapters": [a.to_wire() for a in model.adapters],
        "default_adapter": model.default_adapter,
        # torch.compile's caches (worker/compile_watch.py): kept with the session's state,
        # so a new worker, a restart or a reverted edit loads the compiled code again.
        "compile_cache": str(config.state_dir / "compile-cache" / model.name),
    }
    spec.update(code or {})
    return spec


class WorkerProcess(Worker):
    """One worker process (the port's real side): a control op sends a frame and awaits
    the reply with the same id."""

    def __init__(
        self,
        model: ModelConfig,
        config: Config,
        generation: int,
        code: dict[str, Any] | None = None,
        *,
        boot_nice: int = 0,
        on_death: Callable[[Worker], None] | None = None,
    ) -> None:
        super().__init__(on_death)
        self.model = model
        self.config = config
        self.code = code
        #: > 0 for a standby: the worker's start-up imports run at this niceness.
        self.boot_nice = boot_nice
        self.generation = generation
        #: Installed modules a standby imports at start, at `boot_nice` (standby.py).
        self.preimport: tuple[str, ...] = ()
        #: Times this process was kept, after serving, as the standby for the next reload.
        self.recycled = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.device: str | None = None
        #: CPUs its builds run on, off the serving ones (engine/cpus.py; None: not pinned).
        self.build_cpus: frozenset[int] | None = None
        self._conn: FrameProtocol | None = None
        #: Runs after the channel closed: makes sure the process goes away too.
        self._eof_task: asyncio.Task[None] | None = None
        # A reply goes to a future (control requests) or straight to a callback (infer: the
        # router answers the client in the same loop turn the reply arrives in).
        self._pending: dict[int, asyncio.Future[Frame] | ReplyCallback] = {}
        self._ids = itertools.count(1)
        #: Frames for the worker written in this loop turn, sent together at its end.
        self._out: list[bytes | memoryview] = []
        self._hello: asyncio.Future[Frame] | None = None
        self.dead = asyncio.Event()
        self.exit_reason: str | None = None
        self._stopping = False
        #: False once the channel hit EOF: the exit status may still be a moment away, and a
        #: request sent meanwhile would be lost (and use up its one retry) for nothing.
        self._channel_open = True
        #: Last sampled RSS and peak RSS (bytes), and the OOM-kill count seen while alive.
        self.last_rss: int | None = None
        self.peak_rss: int | None = None
        self._oom_kills_alive: int | None = None
        #: Its cgroups as last read (the limit that applied is looked up at its death).
        self._cgroups: str | None = None
        self._memory_task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        spec = worker_spec(self.model, self.config, self.code)
        spec["boot_nice"] = self.boot_nice
        spec["preimport"] = list(self.preimport)
        spec["build_cpus"] = sorted(self.build_cpus) if self.build_cpus else None
        env[SPEC_ENV] = json.dumps(spec)
        env[FD_ENV] = str(child.fileno())
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hotreload.worker",
                pass_fds=(child.fileno(),),
                env=env,
                cwd=str(self.config.root),
                stdin=asyncio.subprocess.DEVNULL,
                # The worker's own prints go to our stderr so a user's debug output shows.
                stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None,
                start_new_session=True,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self.proc.pid
        try:
            loop = asyncio.get_running_loop()
            self._hello = loop.create_future()
            _, self._conn = await loop.create_unix_connection(
                lambda: FrameProtocol(
                    self.config.max_frame_bytes + 1024 * 1024,
                    self._on_frame,
                    on_error=self._on_channel_error,
                    on_close=self._on_channel_closed,
                    on_unreadable=self._on_unreadable_reply,
                ),
                sock=parent,
            )
            self._exit_task = asyncio.create_task(
                self._watch_exit(), name=f"worker-exit-{self.pid}"
            )
            self._memory_task = asyncio.create_task(
                self._sample_memory(), name=f"worker-memory-{self.pid}"
            )
            hello = await asyncio.wait_for(asyncio.shield(self._hello), timeout_s)
        except TimeoutError:
            await self.end()
            raise WorkerDied(f"worker did not start within {timeout_s:.0f} s") from None
        except BaseException:
            await self.end()  # cancelled, or the channel failed: no process left behind
            raise
        if not hello.header.get("ok"):
            raise WorkerReplyError(hello.header.get("error", {}))
        self.device = hello.header.get("device")

    async def _sample_memory(self) -> None:
        assert self.pid is not None
        while self.proc is not None and self.proc.returncode is None:
            kills = oom_kills()  # before the liveness check: a count read while it lived
            rss = rss_bytes(self.pid)
            if rss:  # a zombie reads 0: its last figures stand
                self.last_rss, self._oom_kills_alive = rss, kills
                self.peak_rss = peak_rss_bytes(self.pid) or self.peak_rss
                self._cgroups = cgroups_of(self.pid) or self._cgroups
            await asyncio.sleep(MEMORY_SAMPLE_S)

    def memory_limit(self) -> CgroupMemory | None:
        """The cgroup memory limit the worker runs under, as last sampled (None: none)."""
        return cgroup_memory(cgroups=self._cgroups) if self._cgroups else None

    def _describe(self, code: int | None) -> str:
        if code == -signal.SIGKILL and not self._stopping and self._oom_kills_alive is not None:
            now = oom_kills()
            if now is not None and now > self._oom_kills_alive:
                return describe_oom_kill(self.last_rss, self.peak_rss, self.memory_limit())
        return _describe_exit(code)

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._memory_task is not None:
            self._memory_task.cancel()
        if self.exit_reason is None or (code is not None and code < 0):
            # A signal is the story; a reset channel was only how it showed.
            self.exit_reason = self._describe(code)
        self._fail_pending()
        if not self.dead.is_set():
            self.dead.set()
            if not self._stopping and self.on_death is not None:
                self.on_death(self)

    def _on_frame(self, frame: Frame) -> None:
        if SPILLED_HEADER in frame.header:  # a large reply: its header is in the payload
            try:
                frame = unspill(frame)
            except ProtocolError as exc:
                self._on_unreadable_reply(exc)
                return
        rid = frame.header.get("id")
        if rid == 0 and self._hello is not None and not self._hello.done():
            self._hello.set_result(frame)
            return
        if frame.header.get(PARTIAL):
            # A streamed request's token: its callback stays for the frames that follow.
            waiter = self._pending.get(rid)  # type: ignore[arg-type]
            if waiter is not None and not isinstance(waiter, asyncio.Future):
                waiter(frame, None)
            return
        waiter = self._pending.pop(rid, None)  # type: ignore[arg-type]
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_result(frame)
        elif waiter is not None:
            waiter(frame, None)

    def _on_unreadable_reply(self, exc: ProtocolError) -> None:
        """A whole reply whose header cannot be read fails its own request, with why; the
        worker and the channel carry on (the stream is still in step)."""
        rid = getattr(exc, "request_id", None)
        if rid is None or (rid not in self._pending and rid != 0):
            # No request to fail: the one it answered times out, the worker serves on.
            print(f"hotreload: worker {self.pid}: a reply was dropped: {exc}", file=sys.stderr)
            return
        # Not the request's fault (a worker sends no header past the limit; it spills big
        # ones into the payload): a server error, HTTP 500, for this request alone.
        message = f"the worker's reply to this request cannot be read: {exc}"
        error = {"code": "model_error", "message": message}
        self._on_frame(Frame({"id": rid, "ok": False, "error": error}, b""))

    def _on_channel_error(self, exc: Exception) -> None:
        self.exit_reason = f"channel error: {exc}"
        if self._conn is not None:
            self._conn.close()  # connection_lost follows: _on_channel_closed does the rest

    def _on_channel_closed(self, exc: Exception | None) -> None:
        if exc is not None and self.exit_reason is None:
            self.exit_reason = f"channel error: {exc}"
        self._channel_open = False
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(WorkerDied(self.exit_reason or "worker exited at start"))
        if self.proc is not None and self.proc.returncode is None and not self._stopping:
            # Pending requests fail once the exit status says why (an OOM kill, say), which
            # follows EOF within milliseconds; `_reap_after_eof` bounds the wait.
            self._eof_task = asyncio.ensure_future(self._reap_after_eof())
        else:
            self._fail_pending()

    async def _reap_after_eof(self) -> None:
        # EOF usually precedes the exit status by a moment; make sure it goes away.
        assert self.proc is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), EXIT_AFTER_EOF_S)
        self._fail_pending()  # (done already by _watch_exit when the status came)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 2.0)
        if self.proc.returncode is None and not self._stopping:
            # Not end(): that marks a stop we asked for, and on_death would not run.
            await self._sigkill()

    def _fail_pending(self) -> None:
        reason = self.exit_reason or "worker channel closed"
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(WorkerDied(reason))
            else:
                waiter(None, WorkerDied(reason))

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and self._channel_open
            and not self.dead.is_set()
        )

    def submit(
        self,
        header: dict[str, Any],
        blobs: Sequence[bytes | memoryview],
        waiter: asyncio.Future[Frame] | ReplyCallback,
    ) -> bool:
        conn = self._conn
        if not self.alive or conn is None:
            return False
        rid = next(self._ids)
        header["id"] = rid
        self._pending[rid] = waiter
        # Corked: the requests a burst of client frames releases in one loop turn leave in
        # one write (one system call and one wake-up of the worker's reader, not one each).
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out += pack_frame(header, blobs)
        return True

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._conn is not None:
            self._conn.write(out)

    async def call(self, request: Request[R], timeout_s: float | None = None) -> R:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        if not self.submit({"op": request.op, **request.wire()}, (), fut):
            raise WorkerDied(self.exit_reason or "worker is not running")
        # The write's drain counts against the deadline too: a worker that stopped reading
        # (a C call holding its GIL, a stopped process) must not hold the caller forever.
        frame = await (
            asyncio.wait_for(self._sent(fut), timeout_s) if timeout_s else self._sent(fut)
        )
        if not frame.header.get("ok"):
            raise WorkerReplyError(frame.header.get("error", {}))
        header = frame.header
        if len(frame.payload):  # bytes beside the header (SmokeReply.payload: golden outputs)
            header = {**header, "payload": frame.payload}
        try:
            return request.reply.from_wire(header)  # type: ignore[return-value]
        except ProtocolError as exc:  # a worker of another shape: its op failed, said why
            raise WorkerReplyError({"code": "protocol_error", "message": str(exc)}) from exc

    async def _sent(self, fut: asyncio.Future[Frame]) -> Frame:
        if self._conn is not None:
            with contextlib.suppress(ConnectionError):
                await self._conn.drain()
        return await fut

    async def end(self, grace_s: float = 0.0) -> None:
        self._stopping = True
        if grace_s > 0 and self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await self.call(ShutdownRequest(), min(grace_s, 2.0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace_s)
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), 2.0)
        await self._sigkill()  # nothing to do when it exited
        self._close()

    async def _sigkill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5.0)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "worker channel closed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process was killed by {name}"
    return f"worker process exited with status {code}"

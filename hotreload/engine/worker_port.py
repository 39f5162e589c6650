"""The one seam between the engine and a worker: `Worker`, one async method per op.

Each control op of protocol/messages.py (`OPS`) is a method here taking its request
dataclass and returning its reply dataclass; an error reply raises `WorkerReplyError`, a
worker that went away `WorkerDied`, a reply past `timeout_s` `TimeoutError`. The request
path (INFER, TEXT) is `submit`: a plain header and its tensors, answered by a callback in
the loop turn the reply arrives in (the router's speed depends on it); a streamed TEXT
request's callback gets each of its frames, and `cancel` stops it at its next token.

A `Worker` owns its process's whole life: `start` spawns it, `end` is the one place it is
stopped (asked to exit within a grace period) or killed (no grace: a forward stuck in a
kernel that never returns). `on_death` is told once when it dies on its own.

Two classes implement it: `engine/worker_proc.py`'s `WorkerProcess` (a real process over a
socketpair) and the scripted fake of the tests (tests/supervisor/fake_worker.py), which
answers through the same request and reply classes; tests/test_worker_ops.py runs one
script of every op against both.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from hotreload.errors import HotreloadError
from hotreload.protocol.messages import (
    CancelRequest,
    DigestReply,
    DigestRequest,
    Done,
    EvalReply,
    EvalRequest,
    FreedReply,
    LoadReply,
    LoadRequest,
    OffloadRequest,
    PingRequest,
    ReleaseRequest,
    Reply,
    Request,
    RestoreReply,
    RestoreRequest,
    RetireRequest,
    SaveReply,
    SaveRequest,
    SmokeReply,
    SmokeRequest,
    StatusReply,
    StatusRequest,
    SwapReply,
    SwapRequest,
    SyncReply,
    SyncRequest,
    WarmReply,
    WarmRequest,
)

if TYPE_CHECKING:
    from hotreload.engine.memory_limits import CgroupMemory
    from hotreload.protocol.framing import Frame

R = TypeVar("R", bound=Reply)

#: Receives (reply frame, None) or (None, the error) exactly once.
ReplyCallback = Callable[["Frame | None", "BaseException | None"], None]


class WorkerDied(HotreloadError):
    """The worker process exited or closed its channel while a request was pending."""


class WorkerReplyError(HotreloadError):
    """The worker answered a request with an error."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.code = error.get("code", "error")
        self.remote_traceback = error.get("traceback")
        #: The exception's class name in the worker (None for the manager's own errors).
        self.error_type: str | None = error.get("type")
        #: A failed LOAD: the project files the build imported or tried to.
        self.imports: tuple[str, ...] = tuple(error.get("imports") or ())
        super().__init__(error.get("message", "worker error"))


class Worker(abc.ABC):
    """One worker process of a model, from spawn to end."""

    #: One per process a model started (a worker's name in its logs).
    generation: int
    pid: int | None
    #: The device it reported at start ("cpu", "cuda:0").
    device: str | None
    #: Times it was kept, after serving, as the standby for the next reload.
    recycled: int
    #: CPUs its builds run on, off the serving ones (engine/cpus.py; None: not pinned).
    build_cpus: frozenset[int] | None
    #: Installed modules a standby imports at start (standby.py).
    preimport: tuple[str, ...]
    #: Set once it is gone, for whatever reason; `exit_reason` says which.
    dead: asyncio.Event
    exit_reason: str | None

    def __init__(self, on_death: Callable[[Worker], None] | None = None) -> None:
        #: Told once, from the event loop, when the worker dies without being ended.
        self.on_death = on_death

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    async def start(self, timeout_s: float) -> None:
        """Spawn it and wait for its hello; WorkerDied past `timeout_s` (nothing is left
        behind), WorkerReplyError when it could not set up (a device it cannot use)."""

    @abc.abstractmethod
    async def end(self, grace_s: float = 0.0) -> None:
        """Stop it: asked to exit, then terminated and killed if it has not within
        `grace_s`; 0 kills it at once. `on_death` is not told. Idempotent."""

    @abc.abstractmethod
    async def call(self, request: Request[R], timeout_s: float | None = None) -> R:
        """One control op: its typed reply (the methods below are this, named)."""

    @abc.abstractmethod
    def submit(
        self,
        header: dict[str, Any],
        blobs: Sequence[bytes | memoryview],
        waiter: asyncio.Future[Frame] | ReplyCallback,
    ) -> bool:
        """A request-path op (INFER, TEXT): `waiter` gets the reply. False (nothing sent)
        when the worker is gone. Sets `header["id"]`, the id a CANCEL names. A streamed
        TEXT request's callback gets every frame: the `PARTIAL` ones (protocol/messages.py),
        then the final reply or the error, once."""

    def memory_limit(self) -> CgroupMemory | None:
        """The cgroup memory limit it runs under (None: none, or not known)."""
        return None

    # ------------------------------------------------------------------ the control ops

    async def load(self, request: LoadRequest, timeout_s: float | None = None) -> LoadReply:
        return await self.call(request, timeout_s)

    async def warm(self, request: WarmRequest, timeout_s: float | None = None) -> WarmReply:
        return await self.call(request, timeout_s)

    async def smoke(self, request: SmokeRequest, timeout_s: float | None = None) -> SmokeReply:
        return await self.call(request, timeout_s)

    async def swap(self, request: SwapRequest, timeout_s: float | None = None) -> SwapReply:
        return await self.call(request, timeout_s)

    async def release(
        self, request: ReleaseRequest, timeout_s: float | None = None
    ) -> FreedReply:
        return await self.call(request, timeout_s)

    async def offload(self, request: OffloadRequest, timeout_s: float | None = None) -> Done:
        return await self.call(request, timeout_s)

    async def retire(self, request: RetireRequest, timeout_s: float | None = None) -> FreedReply:
        return await self.call(request, timeout_s)

    async def restore(
        self, request: RestoreRequest, timeout_s: float | None = None
    ) -> RestoreReply:
        return await self.call(request, timeout_s)

    async def sync(self, request: SyncRequest, timeout_s: float | None = None) -> SyncReply:
        return await self.call(request, timeout_s)

    async def status(
        self, request: StatusRequest, timeout_s: float | None = None
    ) -> StatusReply:
        return await self.call(request, timeout_s)

    async def digest(
        self, request: DigestRequest, timeout_s: float | None = None
    ) -> DigestReply:
        return await self.call(request, timeout_s)

    async def save(self, request: SaveRequest, timeout_s: float | None = None) -> SaveReply:
        return await self.call(request, timeout_s)

    async def eval(self, request: EvalRequest, timeout_s: float | None = None) -> EvalReply:
        return await self.call(request, timeout_s)

    async def ping(self, request: PingRequest, timeout_s: float | None = None) -> Done:
        return await self.call(request, timeout_s)

    async def cancel(self, request: CancelRequest, timeout_s: float | None = None) -> Done:
        return await self.call(request, timeout_s)

"""Per-model request router: a bounded queue, an admission gate, and the in-flight window.

Requests are pumped to the worker from callbacks (on submit and on every reply), not by a
polling task, so an idle model costs nothing and a busy one adds no scheduler hop. The
gate is what a reload closes: new requests wait in the queue (up to its bound and their
timeouts) while in-flight ones drain, and nothing is dropped. A reload that built the new
version in another process hands over instead (`handover`): the gate stays open, new
requests go to the new worker at once, and the old one finishes what it holds.

A streamed text request (`stream`) is in flight from its send to its final frame, so a
drain waits for it; the worker that started it sends all of it (one version). Its timeout
bounds the wait for its first token; past a reload's drain deadline the reload ends it
(`end_streams`; one that has sent nothing yet goes to the new version instead), and a
client gone stops it in the worker (`cancel`). A text request not
streamed is stopped in the worker the same way (a CANCEL, at its next token) when its
timeout passes or its client goes away (`submit_stoppable`).
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hotreload.engine.request_limits import (
    MAX_PARKED_BYTES,
    ParkedRequests,
    request_bytes,
    request_problem,
)
from hotreload.engine.served_shapes import ServedShapes
from hotreload.engine.stats import LatencyWindow, RequestCounters
from hotreload.engine.text_stats import TextStats
from hotreload.engine.text_stream import TextStream
from hotreload.engine.worker_deaths import WorkerDeaths
from hotreload.engine.worker_port import Worker, WorkerDied
from hotreload.errors import (
    BadRequestError,
    ClientError,
    ModelError,
    QueueFullError,
    RequestTimeoutError,
    WorkerUnavailableError,
)
from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import CANCELLED, PARTIAL, CancelRequest
from hotreload.protocol.ops import WorkerOp

#: A request whose worker died is sent once more to the restarted worker, then failed.
MAX_ATTEMPTS = 2
#: At a hand-over, the new worker gets requests once the old one has finished its own, or
#: after this long. So the two never compete for the serving CPUs (two busy serving
#: processes on one core stalled the old one's last requests for 300 ms at times), and a
#: hung old forward delays the new version by this much, not by the drain deadline.
HANDOVER_HOLD_S = 0.1


@dataclass(frozen=True)
class StoppedStreams:
    """What a reload's drain deadline did to the streams in flight (`end_streams`): how
    many ended with an error naming it, how many had sent nothing and moved to the new
    version. True when it stopped any (they stop at their next token: a drain waits)."""

    ended: int = 0
    moved: int = 0

    def __bool__(self) -> bool:
        return bool(self.ended or self.moved)


#: Called exactly once per request with (reply frame, None) or (None, the error).
Done = Callable[[Frame | None, BaseException | None], None]
#: A streamed request's token frames (`PARTIAL`), each as it comes, before `Done`.
OnPart = Callable[[Frame], None]
#: How long a CANCEL may take to be answered (the worker's reader thread answers it).
CANCEL_TIMEOUT_S = 10.0


@dataclass(eq=False, slots=True)
class Request:
    metas: list[dict[str, Any]]
    payload: bytes | memoryview
    done: Done
    enqueued_at: float
    deadline: float
    attempts: int = 0
    sent_at: float = 0.0
    timer: asyncio.TimerHandle | None = None
    expired: bool = False
    finished: bool = False
    #: Per-request parameters (KServe `parameters`), passed to the model as keywords.
    parameters: dict[str, Any] | None = None
    #: Answered by this version or a later one (`Client.infer(min_version=)`).
    min_version: int = 0
    #: A `text` op's request (completions, tokenizer), sent instead of a forward.
    text: dict[str, Any] | None = None
    #: The worker it was last sent to, and its place in that worker's line (send order).
    sent_to: Worker | None = None
    seq: int = 0
    #: A streamed request: gets its token frames; `parts` counts them, `part_version` is
    #: the version of the first (every later one must be the same).
    on_part: OnPart | None = None
    parts: int = 0
    part_version: Any = None
    #: The id the worker knows it by (a CANCEL names it), and the error it ends with once
    #: cancelled (None: not cancelled).
    wire_id: Any = None
    ending: ClientError | None = None
    cancel_sent: bool = False
    #: A stream not started at a reload's drain deadline: stopped in the old worker, then
    #: queued again for the new version (its client has read nothing yet).
    moving: bool = False

    def finish(self, frame: Frame | None, error: BaseException | None) -> None:
        if self.finished:
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        self.done(frame, error)


@dataclass
class ModelRouter:
    name: str
    max_queue_size: int
    request_timeout_s: float
    max_inflight: int
    worker: Worker | None = None
    input_form: str = "single"
    input_signature: list[dict[str, Any]] = field(default_factory=list)
    counters: RequestCounters = field(default_factory=RequestCounters)
    latency: LatencyWindow = field(default_factory=LatencyWindow)
    queue_latency: LatencyWindow = field(default_factory=LatencyWindow)
    #: Tokens per second and time to first token of completions (a text generator's).
    text_stats: TextStats = field(default_factory=TextStats)
    #: What requests parked for a version may hold in all (`request_limits`).
    max_parked_bytes: int = MAX_PARKED_BYTES
    #: The input signatures served lately: a new version's warm phase replays them.
    served: ServedShapes = field(default_factory=ServedShapes)

    def __post_init__(self) -> None:
        self._queue: deque[Request] = deque()
        self._peak_depth = 0
        self._inflight: set[Request] = set()
        #: Requests still running on the worker handed over from (see `handover`).
        self._draining: set[Request] = set()
        self._gate_open = False
        #: Set while nothing is in flight on any worker.
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set while nothing is in flight on the worker handed over from.
        self._drained = asyncio.Event()
        self._drained.set()
        self.unavailable_reason: str | None = None
        #: Set at a hand-over until its timer: the new worker waits for the old one.
        self._holding = False
        #: The version serving now (set by the supervisor).
        self.version = 0
        #: Requests asking for a version not serving yet (`min_version`), oldest first.
        self._parked = ParkedRequests(self.max_parked_bytes)
        self._version_waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._sent = 0
        #: Which request each dead worker's death is put down to.
        self._deaths = WorkerDeaths()
        #: CANCELs on their way (held: a task nobody holds may be collected mid-flight).
        self._cancels: set[asyncio.Future[Any]] = set()
        #: Each worker's last frame (a reply or a stream's token), on the monotonic clock:
        #: its serving thread computes one request at a time, so a request waiting behind
        #: a long stream is not hung while that stream's tokens keep coming.
        self._progress: dict[Worker, float] = {}

    # ------------------------------------------------------------------ figures

    @property
    def depth(self) -> int:
        return len(self._queue)

    def take_peak_depth(self) -> int:
        """Deepest the queue has been since the last call (a 0.5 s sample misses bursts)."""
        peak, self._peak_depth = self._peak_depth, len(self._queue)
        return peak

    @property
    def inflight(self) -> int:
        return len(self._inflight) + len(self._draining)

    @property
    def draining(self) -> int:
        """Requests still running on the worker handed over from."""
        return len(self._draining)

    @property
    def gate_open(self) -> bool:
        return self._gate_open

    def oldest_inflight_age(self, now: float | None = None) -> float:
        """Seconds a worker has held a request without a frame coming back (hung-forward
        detection): per worker, since its oldest request's send or its last frame,
        whichever is later; the most of any worker. A worker's serving thread computes one
        request at a time, so the ones behind a long stream wait without being hung."""
        if not self._inflight and not self._draining:
            self._progress.clear()
            return 0.0
        now = now if now is not None else time.monotonic()
        oldest: dict[Worker | None, float] = {}
        for r in (*self._inflight, *self._draining):
            at = oldest.get(r.sent_to)
            if at is None or r.sent_at < at:
                oldest[r.sent_to] = r.sent_at
        # Workers holding nothing now: their last frame says nothing of the next request.
        for gone in [w for w in self._progress if w not in oldest]:
            del self._progress[gone]
        return max(
            now - max(sent_at, self._progress.get(w, sent_at))  # type: ignore[arg-type]
            for w, sent_at in oldest.items()
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "queue_depth": self.depth,
            "queue_peak": self.take_peak_depth(),
            "queue_limit": self.max_queue_size,
            "inflight": self.inflight,
            "waiting_for_version": len(self._parked),
            "gate_open": self._gate_open,
            "requests": self.counters.as_dict(),
            "latency": self.latency.summary(),
            "queue_latency": self.queue_latency.summary(),
            **({"text": self.text_stats.summary()} if self.text_stats.completions else {}),
        }

    # ------------------------------------------------------------------ intake

    def submit_future(
        self, header: dict[str, Any], payload: bytes | memoryview, *, tensors_checked: bool = False
    ) -> asyncio.Future[Frame]:
        """`submit` for callers that prefer to await a future."""
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        # No stop built (a partial per request): the request path's callers never stop one.
        self.submit(
            header, payload, functools.partial(_settle, fut), tensors_checked=tensors_checked
        )
        return fut

    def submit_stoppable(
        self, header: dict[str, Any], payload: bytes | memoryview = b""
    ) -> tuple[asyncio.Future[Frame], Callable[[], None]]:
        """`submit_future`, with the request's stop: for a caller whose client may go away
        (a text request in flight is then stopped in the worker at its next token)."""
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        req = self.submit(header, payload, functools.partial(_settle, fut))
        stop = functools.partial(self.cancel, req, None) if req is not None else _nothing
        return fut, stop

    def stream(self, header: dict[str, Any], payload: bytes | memoryview = b"") -> TextStream:
        """A streamed `text` request (`header["text"]["stream"]` true): its frames as they
        come (text_stream.py); closing it stops the request."""
        out = TextStream()
        req = self.submit(header, payload, out.done, on_part=out.part)
        if req is not None:
            out.stop = functools.partial(self.cancel, req, None)
        return out

    def submit(
        self,
        header: dict[str, Any],
        payload: bytes | memoryview,
        done: Done,
        on_part: OnPart | None = None,
        *,
        tensors_checked: bool = False,
    ) -> Request | None:
        """Queue one infer request; `done` gets the worker's reply frame or the error.
        `on_part`: a streamed request's token frames, before `done`. Returns the request
        (None: refused at once, `done` was told why). `tensors_checked`: the header's
        tensors were described from the payload by a parser that checked them as
        `validate_metas` does (the KServe front's), and are not checked again.

        Callbacks, not futures, all the way from the client socket to the worker and back:
        a reply is written to the client in the loop turn it arrives in.
        """
        text = header.get("text") if header.get("op") == WorkerOp.TEXT else None
        metas, problem = request_problem(
            header, payload, text, self.input_form, self.input_signature, tensors_checked
        )
        if problem:
            self.counters.bad_request += 1
            done(None, BadRequestError(f"model {self.name!r}: {problem}"))
            return None
        self.served.note(metas)
        parameters = header.get("parameters")
        if self.unavailable_reason is not None:
            self.counters.fail("unavailable")
            done(None, WorkerUnavailableError(self.unavailable_reason))
            return None
        if len(self._queue) >= self.max_queue_size:
            self.counters.rejected += 1
            done(
                None,
                QueueFullError(
                    f"model {self.name!r}: Exceeds maximum queue size (depth {len(self._queue)}, "
                    f"limit {self.max_queue_size}); retry later or raise max_queue_size"
                ),
            )
            return None
        timeout = header.get("timeout_s")
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not math.isfinite(timeout)  # NaN passes `<= 0`, and min(nan, x) is nan
            or timeout <= 0
        ):
            timeout = self.request_timeout_s
        timeout = min(float(timeout), self.request_timeout_s)
        loop = asyncio.get_running_loop()
        # asyncio's loop clock is time.monotonic(), so deadlines and latencies share one clock.
        now = loop.time()
        req = Request(metas, payload, done, now, now + timeout, parameters=parameters or None)
        req.text = text
        req.on_part = on_part
        req.timer = loop.call_at(req.deadline, self._expire, req, timeout)
        min_version = header.get("min_version")
        if isinstance(min_version, int) and min_version > self.version:
            # A trainer asking for the answer of its own push: it waits for that version
            # (to its timeout) instead of being answered by the one before.
            why = self._parked.refusal(
                request_bytes(payload, parameters),
                len(self._queue) + len(self._parked),
                self.max_queue_size,
            )
            if why is not None:
                self.counters.rejected += 1
                req.finish(
                    None,
                    QueueFullError(
                        f"model {self.name!r}: Exceeds maximum queue size: {why}; retry once "
                        f"v{min_version} serves (wait_version), or raise max_queue_size"
                    ),
                )
                return None
            req.min_version = min_version
            self._parked.add(min_version, request_bytes(payload, parameters), req)
            return req
        self._queue.append(req)
        self._peak_depth = max(self._peak_depth, len(self._queue))
        self.pump()
        return req

    def _expire(self, req: Request, timeout: float) -> None:
        if req.finished:
            return
        req.expired = True
        self.counters.timed_out += 1
        if req in self._parked:
            self._parked.remove(req)
            req.finish(
                None,
                RequestTimeoutError(
                    f"model {self.name!r}: version {req.min_version} (min_version) did not "
                    f"serve within {timeout:.3g} s; v{self.version} serves"
                ),
            )
            return
        inside = req in self._inflight or req in self._draining
        if not inside:
            try:
                self._queue.remove(req)
            except ValueError:
                pass
        elif req.text is not None:
            # A text request decodes token by token, for as long as its max_tokens (a chat
            # without one: the rest of the context): stopped at its next token, so the
            # serving thread (and a reload's drain) does not wait on an answer nobody reads.
            self._send_cancel(req)
        where = "inside the worker" if inside else "in the queue"
        req.finish(
            None,
            RequestTimeoutError(
                f"model {self.name!r}: request timed out after {timeout:.3g} s ({where}; "
                f"queue depth {len(self._queue)}, in flight {self.inflight})"
            ),
        )

    # ------------------------------------------------------------------ dispatch

    def pump(self) -> None:
        """Send queued requests while the gate is open and the in-flight window has room."""
        worker = self.worker
        if not self._gate_open or worker is None or not worker.alive:
            return
        if self._draining and self._holding:
            return  # a hand-over: the old worker first (a timer and its replies pump again)
        now = time.monotonic()
        while self._queue and len(self._inflight) < self.max_inflight:
            req = self._queue.popleft()
            req.attempts += 1
            # A stream moving at a reload whose CANCEL never left (its worker died first)
            # is sent again as any other: this send's tokens are its client's.
            req.moving = req.cancel_sent = False
            req.sent_at = now
            self._sent += 1
            if req.sent_to is None:  # its first send: a retry or a move waited elsewhere
                self.queue_latency.add((now - req.enqueued_at) * 1000, now)
            req.sent_to, req.seq = worker, self._sent
            self._inflight.add(req)
            self._idle.clear()
            blobs = [req.payload] if req.metas else []
            on_reply = functools.partial(self._on_reply, req)
            # The deadline travels (one monotonic clock for all processes on the machine):
            # the worker skips a request whose client has given up instead of computing it.
            header = {"op": WorkerOp.INFER, "tensors": req.metas, "deadline": req.deadline}
            if req.text is not None:
                header = {"op": WorkerOp.TEXT, "text": req.text, "deadline": req.deadline}
            elif req.parameters:
                header["parameters"] = req.parameters
            if not worker.submit(header, blobs, on_reply):
                on_reply(None, WorkerDied(worker.exit_reason or "worker is not running"))
                return
            if req.text is not None:
                req.wire_id = header.get("id")  # what a CANCEL names

    def _on_reply(self, req: Request, frame: Frame | None, error: BaseException | None) -> None:
        now = time.monotonic()
        if frame is not None:
            # The worker answered: its serving thread moves (oldest_inflight_age).
            self._progress[req.sent_to] = now  # type: ignore[index]
        if req.on_part is not None and frame is not None:
            if frame.header.get(PARTIAL):
                self._on_part(req, frame, now)
                return
            ok = frame.header.get("ok")
            if ok and req.parts and frame.header.get("version") != req.part_version:
                req.finish(None, self._mixed(req, frame))
        # Decided while `req` is still held: the oldest its dead worker held is the one it
        # was computing, even when that one's client gave up on it already (a timeout).
        culprit = isinstance(error, WorkerDied) and self._deaths.computing_when_died(
            req, (*self._inflight, *self._draining)
        )
        if req in self._draining:
            self._draining.discard(req)
            if not self._draining:
                self._drained.set()
        else:
            self._inflight.discard(req)
        if not self._inflight and not self._draining:
            self._idle.set()
        if error is not None:
            self._on_worker_failure(req, error, culprit)
        elif not req.finished and frame is not None:
            if frame.header.get("ok"):
                self.counters.ok += 1
                if not req.parts:  # a stream's went in at its first token (`_on_part`)
                    self.latency.add((now - req.enqueued_at) * 1000, now)
                if req.text is not None:
                    self.text_stats.add(frame.header, now)
                req.finish(frame, None)
            else:
                err = frame.header.get("error") or {}
                message = f"model {self.name!r}: {err.get('message')}"
                if err.get("code") == "worker_unavailable":
                    self.counters.fail("unavailable")
                    req.finish(None, WorkerUnavailableError(message))
                elif err.get("code") == "bad_request":
                    # Found by the worker (a parameter the model does not take).
                    self.counters.bad_request += 1
                    bad = BadRequestError(message)
                    # The request field at fault, when the worker names one (OpenAI's
                    # error object carries it: http/replies.py).
                    bad.param = err.get("param")  # type: ignore[attr-defined]
                    req.finish(None, bad)
                elif err.get("code") == "timeout":
                    # The worker's clock passed the deadline a moment before our timer.
                    self.counters.timed_out += 1
                    req.finish(None, RequestTimeoutError(message))
                elif err.get("code") == CANCELLED and req.moving and not req.expired:
                    # Stopped before its first token to move to the new version: queued
                    # again, first, behind the gate the reload holds (the old worker's send
                    # was no attempt of its own: a death later may still retry it).
                    req.moving = req.cancel_sent = False
                    req.wire_id = None
                    req.attempts -= 1
                    self._queue.appendleft(req)
                elif err.get("code") == CANCELLED:
                    # Stopped by `cancel`: a reload's end counts as unavailable; a client
                    # gone is nobody's failure.
                    ending = req.ending or WorkerUnavailableError(message)
                    if isinstance(ending, WorkerUnavailableError):
                        self.counters.fail("unavailable")
                    req.finish(None, ending)
                else:
                    self.counters.fail("model_error")
                    req.finish(None, ModelError(message, err.get("traceback")))
        self.pump()

    def _on_part(self, req: Request, frame: Frame, now: float) -> None:
        """A streamed request's token frame: handed on, unless its client is gone (its
        CANCEL is on the way). The first lifts its timeout (which bounds the wait for the
        first token); each counts as progress for the hung-forward watchdog."""
        if req.finished or req.moving:
            return  # a stream moving to the new version: the old one's start is dropped
        version = frame.header.get("version")
        if req.parts == 0:
            req.part_version = version
            if req.timer is not None:
                req.timer.cancel()
                req.timer = None
            # Its latency is its time to first token: a stream's length is its client's
            # max_tokens, not the model's speed (the p99 would be the longest answer's).
            self.latency.add((now - req.enqueued_at) * 1000, now)
        elif version != req.part_version:
            self.cancel(req, self._mixed(req, frame))
            return
        req.parts += 1
        # A stream's forward is each token: its age counts from its last one.
        req.sent_at = now
        if req.on_part is not None:
            req.on_part(frame)

    def _mixed(self, req: Request, frame: Frame) -> ModelError:
        """A stream whose frames name two versions ends: a client never reads a mixed
        answer. (The worker's one serving thread decodes a stream whole: not expected.)"""
        self.counters.fail("model_error")
        return ModelError(
            f"model {self.name!r}: stream ended: v{req.part_version} wrote its start and "
            f"v{frame.header.get('version')} sent more; retry"
        )

    def cancel(self, req: Request, error: ClientError | None = None) -> None:
        """Stop `req`: queued or parked, it is dropped and answered `error` now; a stream
        in its worker is stopped there at its next token and answered `error` when the
        worker says it stopped (it stays in flight until then: a drain waits for it), and
        so is a text request not streamed. `error` None: its client went away (nothing to
        count, nobody to tell)."""
        if req.finished:
            return
        req.moving = False  # ended, even if a reload was moving it to the new version
        req.ending = error or ClientError(f"model {self.name!r}: the client went away")
        if req in self._parked:
            self._parked.remove(req)
            req.finish(None, req.ending)
            return
        if req in self._inflight or req in self._draining:
            if req.text is not None:
                self._send_cancel(req)
            else:
                req.finish(None, req.ending)
            return
        try:
            self._queue.remove(req)
        except ValueError:
            pass
        req.finish(None, req.ending)

    def _send_cancel(self, req: Request) -> None:
        worker = req.sent_to
        if req.cancel_sent or req.wire_id is None or worker is None or not worker.alive:
            return  # a worker gone fails it anyway (WorkerDied)
        req.cancel_sent = True
        task = asyncio.ensure_future(worker.cancel(CancelRequest(req.wire_id), CANCEL_TIMEOUT_S))
        self._cancels.add(task)
        task.add_done_callback(self._cancel_done)

    def _cancel_done(self, task: asyncio.Future[Any]) -> None:
        self._cancels.discard(task)
        if not task.cancelled():
            task.exception()  # read: a worker that died meanwhile fails the stream itself

    def end_streams(
        self,
        version: int,
        drain_s: float,
        *,
        worker: Worker | None = None,
        sent_up_to: int | None = None,
        why: str | None = None,
    ) -> StoppedStreams:
        """A reload to `version` past its drain deadline: stop the streams in flight (on
        `worker`; sent at or before send number `sent_up_to`, the ones ahead of an in-band
        swap). One that has sent its client a token ends with an error naming the reload;
        one that has not (it waited behind the others in the worker) is stopped there and
        queued again for the new version. `why`: what else ends them, an unload or a
        shutdown (all end: there is no next version)."""
        what, whose = (why, "the") if why else (f"model reloading to v{version}", "the reload's")
        error = WorkerUnavailableError(
            f"model {self.name!r}: stream ended: {what} (the stream ran past {whose} "
            f"{drain_s:g} s drain deadline, deadlines.drain_s); retry"
        )
        stopped = [
            r
            for r in (*self._inflight, *self._draining)
            if r.on_part is not None
            and not r.finished
            and (worker is None or r.sent_to is worker)
            and (sent_up_to is None or r.seq <= sent_up_to)
        ]
        moved = 0
        for req in stopped:
            if why is None and req.parts == 0 and not req.cancel_sent:
                req.moving = True
                self._send_cancel(req)
                moved += 1
            else:
                self.cancel(req, error)
        return StoppedStreams(len(stopped) - moved, moved)

    @property
    def sent(self) -> int:
        """Requests sent to a worker so far: the send number of the last one."""
        return self._sent

    def hung_on(self, worker: Worker, forward_s: float) -> None:
        """`worker` is about to be killed as wedged: when the oldest request it holds ran
        past `forward_s`, that one is told it hung (a 504) and the others it held are
        retried on the restarted worker (worker_deaths.py)."""
        held = (*self._inflight, *self._draining)
        now = time.monotonic()
        mine = [r for r in held if r.sent_to is worker]
        oldest = min(mine, key=lambda r: r.seq, default=None)
        if oldest is not None:
            # Its forward started at the worker's last frame when that came later than its
            # send (it waited behind another request): judged from there, as the watchdog
            # judges it, by moving the clock back by that wait.
            now -= max(self._progress.get(worker, 0.0) - oldest.sent_at, 0.0)
        self._deaths.hung_on(worker, held, forward_s, now)

    def _on_worker_failure(self, req: Request, exc: BaseException, culprit: bool) -> None:
        if req.finished:
            return
        verdict = self._deaths.verdict(self.name, req, exc, culprit)
        if verdict is not None:  # to blame: not sent again
            if isinstance(verdict, RequestTimeoutError):
                self.counters.timed_out += 1
            else:
                self.counters.fail("unavailable")
            req.finish(None, verdict)
            return
        if req.ending is not None:  # cancelled: not sent again
            if isinstance(req.ending, WorkerUnavailableError):
                self.counters.fail("unavailable")
            req.finish(None, req.ending)
            return
        if req.parts:
            # A stream part-sent: sent again it would start over (or on another version)
            # after what its client has read.
            self.counters.fail("unavailable")
            req.finish(
                None,
                WorkerUnavailableError(
                    f"model {self.name!r}: stream ended: its worker failed after "
                    f"{req.parts} chunk(s) ({self._deaths.reason(req, exc)}); retry"
                ),
            )
            return
        if isinstance(exc, WorkerDied) and req.attempts < MAX_ATTEMPTS and not req.expired:
            # Retry once on the restarted worker, ahead of newer requests.
            self.counters.retried += 1
            self._queue.appendleft(req)
            return
        self.counters.fail("unavailable")
        reason = self._deaths.reason(req, exc)
        req.finish(
            None,
            WorkerUnavailableError(
                f"model {self.name!r}: worker failed while serving this request ({reason}); "
                f"it was tried {req.attempts} time(s)"
            ),
        )

    # ------------------------------------------------------------------ reload support

    def serving_version(self, version: int) -> None:
        """`version` serves from now on: release what waited for it."""
        self.version = version
        for n, fut in self._version_waiters:
            if n <= version and not fut.done():
                fut.set_result(version)
        ready = self._parked.take_ready(version)
        self._queue.extend(r for r in ready if not r.finished)
        self.pump()

    async def wait_version(self, version: int, timeout_s: float) -> int:
        """The serving version once it is `version` or later; RequestTimeoutError when
        `timeout_s` passes first."""
        if self.version >= version:
            return self.version
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (version, fut)
        self._version_waiters.append(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(
                f"model {self.name!r}: version {version} did not serve within "
                f"{timeout_s:.3g} s; v{self.version} serves"
            ) from None
        finally:
            self._version_waiters.remove(entry)

    def refuse_until_reload(self, why: str) -> None:
        """Answer this model's requests at once with `why` (the other models keep serving)
        until a reload brings it up (`open_gate` ends it). Those waiting already (sent
        while it started) get the same answer now, not at their timeout."""
        self.unavailable_reason = (
            f"model {self.name!r} {why}; fix it, then reload it (save it under `watch`, or "
            f"`hotreload reload {self.name}`)"
        )
        self.fail_queued(WorkerUnavailableError(self.unavailable_reason))

    def open_gate(self) -> None:
        self._gate_open = True
        self.unavailable_reason = None
        self.pump()

    def set_limits(self, max_queue_size: int, request_timeout_s: float, max_inflight: int) -> None:
        """The model's limits, edited while it serves: applied to the next request."""
        self.max_queue_size, self.request_timeout_s = max_queue_size, request_timeout_s
        self.max_inflight = max_inflight

    def handover(self, worker: Worker) -> None:
        """Send to `worker` from now on; requests in flight on the previous worker finish
        there first (`drain_previous` waits for them; one that dies is retried here), for
        at most HANDOVER_HOLD_S, then the new worker gets a full in-flight window."""
        self._draining |= self._inflight
        self._inflight = set()
        if self._draining:
            self._drained.clear()
            self._holding = True
            asyncio.get_running_loop().call_later(HANDOVER_HOLD_S, self._end_hold)
        self.worker = worker
        self.open_gate()

    def _end_hold(self) -> None:
        self._holding = False
        self.pump()

    async def drain_previous(self, timeout_s: float) -> bool:
        """Wait until the worker handed over from holds no request; False on timeout."""
        return await _wait(self._drained, timeout_s)

    def close_gate(self) -> None:
        """Stop sending to the worker; new requests wait in the queue."""
        self._gate_open = False

    async def drain(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; False when `timeout_s` passes first."""
        return await _wait(self._idle, timeout_s)

    def fail_queued(self, error: ClientError) -> int:
        """Fail every queued request (shutdown, or a model that cannot be brought back)."""
        n = 0
        self._queue.extend(self._parked.take_all())
        while self._queue:
            req = self._queue.popleft()
            if not req.finished:
                self.counters.fail("unavailable")
                req.finish(None, error)
                n += 1
        return n


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


def _settle(fut: asyncio.Future[Frame], frame: Frame | None, error: BaseException | None) -> None:
    """A request's `Done` for a caller awaiting `fut`."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(frame)  # type: ignore[arg-type]


def _nothing() -> None:
    """The stop of a request refused at once (its error is given already)."""

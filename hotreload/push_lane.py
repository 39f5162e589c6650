"""Pushes a trainer makes without waiting: a handle per push, and one lane per model that
keeps at most one push in flight and one pending.

`update_weights(..., wait=False)` packs the state into a sealed memfd on the caller's
thread (after that the trainer may change its tensors: the bytes are the ones it had) and
returns a `PushHandle`. The lane sends it when no earlier push of the model is still being
built; else it waits as the one pending push, and a newer push replaces it (its handle
fails with PushSupersededError naming the newer one). So a trainer pushing every few steps
while a push takes longer than that never queues a backlog of stale states: the newest
one goes next.

Which tensors travel is decided at packing (push_changes.py): those changed since the
push that made the serving weights. The lane records what a push held once it serves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hotreload.errors import ClientError, PushSupersededError, StaleBaseError
from hotreload.protocol.framing import Frame
from hotreload.protocol.shared_state import PackedState, pack_state
from hotreload.protocol.weights_ops import update_weights_header, weights_reply
from hotreload.push_changes import Baseline, PushPlan, after_push, plan_push


class PushHandle:
    """One push made with `wait=False`. `done()`, `result(timeout)` (the push's reply: the
    version and digest that serve it, or its error raised), `superseded_by` (the handle
    of the push that replaced this one before it was sent), and the figures of what it
    sent: `sent_tensors`, `skipped_tensors` (unchanged since the last push: not sent),
    `sent_bytes`. `await handle` works in async code."""

    def __init__(self, model: str | None, plan: PushPlan, sent_bytes: int) -> None:
        self.model = model
        self.sent_tensors = len(plan.send)
        self.skipped_tensors = plan.skipped
        self.sent_bytes = sent_bytes
        self.superseded_by: PushHandle | None = None
        self._future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._was_sent = False
        #: Set once the request is written, or the push ended before it could be.
        self._handed = threading.Event()

    def done(self) -> bool:
        """Has the push served, failed or been superseded?"""
        return self._future.done()

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """`{"version", "digest", ...}` once the pushed weights serve. Raises the push's
        error (ReloadFailedError: the old weights serve on; PushSupersededError), or
        TimeoutError when `timeout` passes first (the push goes on)."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the push to {self.model!r} was not served within {timeout} s (it goes on)"
            ) from None

    def __await__(self) -> Any:
        return asyncio.wrap_future(self._future).__await__()

    @property
    def sent(self) -> bool:
        """Has the request left the client (False while it waits as the pending push)?"""
        return self._was_sent

    def _mark_sent(self) -> None:
        self._was_sent = True
        self._handed.set()

    def __repr__(self) -> str:
        if not self.done():
            state = "sent" if self.sent else "pending"
        elif self.superseded_by is not None:
            state = "superseded"
        elif self._future.exception() is not None:
            state = "failed"
        else:
            reply = self._future.result()
            state = f"serving v{reply['version']} {reply['digest']}"
        return (
            f"<PushHandle {self.model!r} {state}: {self.sent_tensors} tensor(s), "
            f"{self.sent_bytes} bytes sent, {self.skipped_tensors} unchanged>"
        )

    # What the lane does with it.
    def _settle(self, result: dict[str, Any] | None, error: BaseException | None) -> None:
        self._handed.set()  # wakes a caller waiting for the hand-over, whatever happened
        if self._future.done():
            return
        if error is not None:
            self._future.set_exception(error)
        else:
            self._future.set_result(result or {})


@dataclass
class PushEntry:
    """A packed push waiting for, or in, its request."""

    handle: PushHandle
    packed: PackedState
    plan: PushPlan
    timeout_s: float | None

    def header(self, baseline: Baseline | None) -> dict[str, Any]:
        """The request; StaleBaseError when the delta's base no longer serves."""
        if self.plan.delta and baseline is None:
            raise StaleBaseError(
                f"the push to {self.handle.model!r} sent only the tensors changed since a "
                "push whose weights no longer serve; it was not sent. The next push sends "
                "every tensor"
            )
        header = update_weights_header(
            self.handle.model, self.packed, self.plan.strict, self.timeout_s
        )
        if self.plan.delta and baseline is not None:
            # At send time: the digest of the newest served push (the delta holds every
            # tensor changed since the push it was planned against, older or the same).
            header["base_digest"] = baseline.digest
        return header

    def supersede(self, by: PushHandle) -> None:
        self.packed.abandon()  # never sent: give the memory (and any IPC counts) back
        self.handle.superseded_by = by
        self.handle._settle(
            None,
            PushSupersededError(
                f"the push to {self.handle.model!r} was replaced by a later one before it "
                "was sent (a trainer's pushes do not queue: the newest goes next)",
                by,
            ),
        )


def pack_push(
    model: str | None,
    state: Mapping[str, Any],
    baseline: Baseline | None,
    *,
    strict: bool,
    full: bool,
    timeout_s: float | None,
) -> PushEntry:
    """Plan and pack one push (on the caller's thread: the hand-over). The packed state
    holds the tensors' bytes as they are now (host ones in a sealed memfd, CUDA ones in
    chunks copied on their device), so the trainer may write its tensors once it returns."""
    plan = plan_push(state, baseline, strict=strict, full=full)
    packed = pack_state(plan.send)
    sent = int(packed.descriptor.get("size") or 0) + sum(
        int(t["nbytes"]) for t in packed.descriptor["tensors"] if t["via"] == "cuda_ipc"
    )
    return PushEntry(PushHandle(model, plan, sent), packed, plan, timeout_s)


def reply_of(entry: PushEntry, frame: Frame) -> dict[str, Any]:
    """The reply: `{"version", "digest"}` (what was sent is on the handle)."""
    return weights_reply(frame)


class _LaneState:
    """One model's lane, shared by the thread and asyncio forms: the baseline, the push in
    flight and the one pending. Every field is read and written under `lock`."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.baseline: Baseline | None = None
        self.in_flight: PushEntry | None = None
        self.pending: PushEntry | None = None
        self.closed = False

    def offer(self, entry: PushEntry) -> bool:
        """Take `entry`; True when it is to be sent now (nothing in flight)."""
        with self.lock:
            if self.closed:
                entry.packed.abandon()
                raise ClientError("the client is closed; its pushes stop")
            if self.in_flight is None:
                self.in_flight = entry
                return True
            old, self.pending = self.pending, entry
        if old is not None:
            old.supersede(entry.handle)
        return False

    def finished(
        self, entry: PushEntry, reply: dict[str, Any] | None, error: BaseException | None
    ) -> PushEntry | None:
        """Record how `entry` ended; the next entry to send (the pending one), or None."""
        with self.lock:
            if reply is not None:
                self.baseline = after_push(
                    self.baseline, entry.plan, reply["version"], reply["digest"]
                )
            elif isinstance(error, StaleBaseError):
                self.baseline = None
            nxt, self.pending = self.pending, None
            self.in_flight = nxt
        entry.handle._settle(reply, error)
        return nxt

    def close(self) -> None:
        with self.lock:
            self.closed = True
            pending, self.pending = self.pending, None
        if pending is not None:
            pending.packed.abandon()
            pending.handle._settle(
                None, ClientError("the client was closed before this push was sent")
            )


def _outcome(
    entry: PushEntry, frame_or_error: Frame | BaseException
) -> tuple[dict[str, Any] | None, BaseException | None]:
    if isinstance(frame_or_error, BaseException):
        return None, frame_or_error
    try:
        return reply_of(entry, frame_or_error), None
    except Exception as exc:
        return None, exc


class ThreadLane(_LaneState):
    """A lane for the blocking `Client`: a thread sends each push and waits for its reply
    (on a connection of its own), then sends the pending one, and ends when none is left."""

    def __init__(
        self, model: str | None, call: Callable[..., Frame], done: Callable[[], None]
    ) -> None:
        super().__init__(model)
        self._call = call
        #: Closes the thread's own connection as it ends (one thread per busy spell).
        self._done = done

    def submit(self, entry: PushEntry) -> bool:
        """Send `entry` now (True), or keep it as the pending push (False)."""
        if not self.offer(entry):
            return False
        threading.Thread(
            target=self._run, args=(entry,), name=f"hotreload-push-{self.model}", daemon=True
        ).start()
        return True

    def _run(self, entry: PushEntry | None) -> None:
        try:
            while entry is not None:
                entry = self.finished(entry, *self._send(entry))
        finally:
            self._done()

    def _send(self, entry: PushEntry) -> tuple[dict[str, Any] | None, BaseException | None]:
        try:
            with self.lock:
                header = entry.header(self.baseline)
            frame = self._call(header, timeout_s=entry.timeout_s, on_sent=entry.handle._mark_sent)
            return _outcome(entry, frame)
        except BaseException as exc:
            if not entry.handle.sent:
                entry.packed.abandon()
            return None, exc
        finally:
            with contextlib.suppress(Exception):
                entry.packed.close()  # the session holds its own reference once it read it


class AsyncLane(_LaneState):
    """The same for `AsyncClient`: a task on its loop in place of the thread."""

    def __init__(self, model: str | None, call: Callable[..., Awaitable[Frame]]) -> None:
        super().__init__(model)
        self._call = call
        self._task: asyncio.Task[None] | None = None

    def submit(self, entry: PushEntry) -> None:
        if self.offer(entry):
            self._task = asyncio.get_running_loop().create_task(self._run(entry))

    async def _run(self, entry: PushEntry | None) -> None:
        while entry is not None:
            reply, error = await self._send(entry)
            entry = self.finished(entry, reply, error)
            if isinstance(error, asyncio.CancelledError):
                if entry is not None:
                    entry.packed.abandon()
                    self.finished(entry, None, ClientError("the push task was cancelled"))
                raise error

    async def _send(self, entry: PushEntry) -> tuple[dict[str, Any] | None, BaseException | None]:
        try:
            with self.lock:
                header = entry.header(self.baseline)
            wait = None if entry.timeout_s is None else entry.timeout_s + 5.0
            frame = await self._call(header, timeout_s=wait, on_sent=entry.handle._mark_sent)
            return _outcome(entry, frame)
        except BaseException as exc:  # CancelledError too: the handle must settle
            if not entry.handle.sent:
                entry.packed.abandon()
            return None, exc
        finally:
            with contextlib.suppress(Exception):
                entry.packed.close()

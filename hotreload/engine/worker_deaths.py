"""What a worker's death is put down to, and what each request it held is told.

A worker's serving thread computes its requests in send order, so when it dies the oldest
request it held is the one it was computing. That one may be what killed it (a crash, a
hung forward) and is not sent again: sent again, it killed the new worker too, and 25
innocent requests behind it timed out (issue 30). The others are innocent and are retried
on the restarted worker.

When the supervisor kills a worker because a forward hung past `forward_s`, it says so
first (`hung_on`): the request that hung gets a 504 saying it was killed past its deadline,
and no other request is told it "may be what killed the worker" (issue 38: one sent just
after a 200k-token prompt was, because the prompt's client had timed out first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from hotreload.engine.worker_port import WorkerDied
from hotreload.errors import ClientError, RequestTimeoutError, WorkerUnavailableError


class Held(Protocol):
    """What this module reads of a request a worker held (router.Request)."""

    seq: int
    sent_at: float
    sent_to: Any


class WorkerDeaths:
    """One model's record of which request each dead worker's death was put down to."""

    def __init__(self) -> None:
        #: Workers whose death was put down to one request already.
        self._blamed: deque[Any] = deque(maxlen=8)
        #: (worker, the request that hung it, seconds it had run, the forward_s it passed)
        #: for workers killed for a hung forward.
        self._hung: deque[tuple[Any, Held, float, float]] = deque(maxlen=8)

    def hung_on(self, worker: Any, held: Iterable[Held], forward_s: float, now: float) -> None:
        """`worker` is about to be killed as wedged. When the oldest request it holds has
        run past `forward_s` (by `now`, the monotonic clock), that request hung it."""
        mine = [r for r in held if r.sent_to is worker]
        oldest = min(mine, key=lambda r: r.seq, default=None)
        if oldest is None or now - oldest.sent_at <= forward_s:
            return  # wedged in a sync, say: no request is to blame
        self._blamed.append(worker)
        self._hung.append((worker, oldest, now - oldest.sent_at, forward_s))

    def computing_when_died(self, req: Held, held: Iterable[Held]) -> bool:
        """Was `req` (still among `held`) the request its worker was computing when it
        died? True once per worker, for the oldest it held, whether or not that one's
        client is still waiting (a timeout may have answered it already)."""
        worker = req.sent_to
        if worker is None or any(w is worker for w in self._blamed):
            return False
        if any(r.sent_to is worker and r.seq < req.seq for r in held):
            return False
        self._blamed.append(worker)
        return True

    def verdict(
        self, model: str, req: Held, exc: BaseException, culprit: bool
    ) -> ClientError | None:
        """The answer of a request whose worker died with it, when it is not to be sent
        again because it is to blame; None for an innocent one."""
        for _, hung, ran_s, forward_s in self._hung:
            if hung is req:
                return RequestTimeoutError(
                    f"model {model!r}: this request's forward ran for {ran_s:.3g} s inside "
                    f"the worker, past its deadline (deadlines.forward_s = {forward_s:g} s): "
                    "the worker was killed past its deadline and restarted, and the request "
                    "is not sent again. Make it lighter (a shorter prompt, a smaller batch) "
                    "or raise deadlines.forward_s"
                )
        if isinstance(exc, WorkerDied) and culprit:
            return WorkerUnavailableError(
                f"model {model!r}: the worker died while computing this request ({exc}); it "
                "is not sent again, since it may be what killed the worker. The requests "
                "behind it are retried on the restarted worker"
            )
        return None

    def reason(self, req: Held, exc: BaseException) -> str:
        """Why an innocent request's worker failed, for one that cannot be retried."""
        if any(worker is req.sent_to for worker, *_ in self._hung):
            return "it was killed and restarted because another request's forward hung"
        return str(exc) if isinstance(exc, WorkerDied) else f"{type(exc).__name__}: {exc}"

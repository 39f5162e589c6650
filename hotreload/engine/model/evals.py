"""The eval of each new version (config `eval = "evals.py:score"`): asked for once the
version serves and its job's outcome was answered, in the worker's eval thread: never on a
request's path, and never on the job loop's either.

An eval runs as the model's own task (`Evals`), beside the job loop: a reload, a restart
or the hung-forward watchdog (recovery.py, which acts only while no job runs) never waits
for one. At most one eval is outstanding per model: a new version's eval waits for the
previous one's result (bounded by its `eval_timeout_s`), and is skipped, said so, when the
previous one still runs in the same worker past its deadline (the worker cannot stop a
Python callable: its thread runs on). A version replaced before its eval could start is
reported as not scored.

Bounded by `eval_timeout_s`; an eval that raises, returns something else than a dict of
floats, or runs past its deadline is reported (the `eval_done` event's `error`, the history
row, `status`) and the version serves on. Figures land in the version's record, its history
row (ReloadOutcome.eval) and the `eval_done` event the dashboard, the report, the printer
and `HotreloadPush` read.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hotreload.engine.event_kinds import EvalDone
from hotreload.engine.model.jobs import ReloadOutcome
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.messages import EvalReply, EvalRequest

#: The model's supervisor.ModelSupervisor (which imports this module: typed loosely here).
Supervisor = Any


class Evals:
    """One model's evals: the task that asks for the latest (at most one outstanding), and
    the worker call still running past its deadline, if any."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        #: The worker's eval call, awaited to its real end (a timed-out one runs on there).
        self._call: tuple[Worker, int, asyncio.Task[EvalReply]] | None = None
        #: The newest version an eval was asked for (a restart serves it again: not rescored).
        self._asked = 0

    def after(self, sup: Supervisor, outcome: ReloadOutcome | None) -> None:
        """Score the version a job just made serve (`outcome` None: a start's first
        version; an unchanged or failed reload made none), in the background."""
        if sup.model.eval is None:
            return
        if outcome is not None and (not outcome.ok or outcome.unchanged):
            return
        current, worker = sup.record.current, sup.record.serving
        if current is None or worker is None or not worker.alive or current.eval is not None:
            return
        if current.version <= self._asked:
            return
        self._asked = current.version
        previous = self._task
        self._task = asyncio.create_task(
            self._score(sup, outcome, current, worker, previous), name=f"eval-{sup.name}"
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def wait(self) -> None:
        """Until the eval asked for last has its result (tests, `close`)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    async def close(self) -> None:
        """The session stops: the eval's wait ends (the worker stops with it)."""
        for task in (self._task, self._call[2] if self._call else None):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _score(
        self,
        sup: Supervisor,
        outcome: ReloadOutcome | None,
        current: VersionInfo,
        worker: Worker,
        previous: asyncio.Task[None] | None,
    ) -> None:
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # its result first: bounded by its deadline
        result = await self._ask(sup, current, worker)
        sup.st.note_eval(current, outcome, result)
        sup.events.emit(EvalDone(model=sup.name, **result))

    async def _ask(self, sup: Supervisor, current: VersionInfo, worker: Worker) -> dict[str, Any]:
        result: dict[str, Any] = {"version": current.version}
        serving = sup.record.current
        if serving is not current or not worker.alive:
            now = f"v{serving.version} does" if serving is not None else "no version does"
            result["error"] = f"not scored: v{current.version} no longer serves ({now})"
            return result
        if self._call is not None and not self._call[2].done() and self._call[0] is worker:
            result["error"] = (
                f"not scored: the eval of v{self._call[1]} still runs in the worker past "
                "eval_timeout_s (a Python callable cannot be stopped there); one eval runs "
                "per worker at a time: raise eval_timeout_s, or score fewer inputs"
            )
            return result
        deadline = sup.model.eval_timeout_s
        # No deadline on the call itself: it is awaited to its end so that the next eval
        # knows whether this one still runs in the worker; the deadline bounds the wait here.
        call = asyncio.create_task(worker.eval(EvalRequest(current.version), None))
        self._call = (worker, current.version, call)
        call.add_done_callback(_quiet)
        try:
            reply = await asyncio.wait_for(asyncio.shield(call), deadline)
            result.update(figures=reply.figures, eval_s=reply.eval_s)
        except WorkerReplyError as exc:
            result["error"] = str(exc)
        except TimeoutError:
            result["error"] = (
                f"the eval did not finish within eval_timeout_s = {deadline:g} s; v"
                f"{current.version} serves on (raise eval_timeout_s, or score fewer inputs)"
            )
        except WorkerDied as exc:
            result["error"] = f"the worker died during the eval: {exc}"
        return result


def _quiet(task: asyncio.Task[Any]) -> None:
    """A call outliving its deadline may end in an error nobody awaits: read it."""
    if not task.cancelled():
        task.exception()

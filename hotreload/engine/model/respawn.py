"""Strategy `respawn`: the new version is built in another worker process.

By default that process was started ahead of time (the standby, which the supervisor keeps),
so a reload pays for neither a process start nor torch's import, and the build shares
neither the serving process's GIL nor its thread pools. Once it is built, warm and
smoke-tested, the supervisor hands traffic over to it while the old one finishes its
requests; the old one, its streams synced idle, then becomes the next standby (`recycle`
times per process). A load that fails in such a reused worker is tried once in a fresh
process, because code with a one-time effect per process fails a second import in the same
interpreter.

The strategy is a value: it returns what it built or decided (`Built`, `Retired`), and
what it learns about the model (its workers must not be reused) goes into the model's state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hotreload.engine.model import phases
from hotreload.engine.model.built import Built, Retired
from hotreload.engine.model.jobs import PhaseFailed, Ran
from hotreload.engine.model.phases import BuildSpec, RunPhase
from hotreload.engine.model.state import ModelState
from hotreload.engine.model.workers import Held, WorkerFactory
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.protocol.messages import RetireRequest

#: Errors that come out the same in any process: a broken file, not a reused interpreter.
DETERMINISTIC_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError", "LoadError"})


class Respawn:
    def __init__(self, st: ModelState, workers: WorkerFactory, *, fresh: bool = False) -> None:
        self.st, self.workers = st, workers
        #: A fresh worker for this reload only (new settings: settings_change.py): no
        #: standby is taken, and the old worker is stopped, never kept.
        self.fresh = fresh
        #: The history row's strategy.
        self.name = "fresh worker" if fresh else "respawn"

    @property
    def wants_standby(self) -> bool:
        model = self.st.model
        return not self.fresh and model.strategy == "respawn" and model.standby

    # ------------------------------------------------------------------ building

    async def build(self, run: RunPhase, spec: BuildSpec, standby: Worker | None = None) -> Built:
        """A worker (`standby` if there is one) with the version built, warm, smoke-tested
        and swapped in on its side. A build that fails to import in a reused worker is tried
        once more in a fresh process: code with a one-time effect per process (a
        `TORCH_LIBRARY` definition, a metrics registry) fails the second time it is imported
        in the same interpreter, and that must not read as the user's edit being broken."""
        reused = standby is not None and standby.recycled > 0
        try:
            return await self._build_in(run, spec, standby, fresh=False)
        except PhaseFailed as exc:
            if not (reused and exc.phase == "load" and _may_be_reuse(exc)):
                raise
            first = exc
        built = await self._build_in(run, spec, None, fresh=True)
        why = (
            f"v{spec.version} failed to import in a reused worker ({first}) and built in a "
            "fresh one: this code does not survive a second import in one process"
        )
        built.detail.append(why + "; workers are no longer reused for this model")
        self.st.stop_recycling(why)
        return built

    async def _build_in(
        self, run: RunPhase, spec: BuildSpec, standby: Worker | None, *, fresh: bool
    ) -> Built:
        async with self._worker(run, standby, fresh=fresh, code=spec.code) as held:
            worker = held.worker
            # A recycled standby still holds the code of the version before last:
            # re-import even for a weights-only change.
            spec = _with_reimport(spec, spec.reimport or worker.recycled > 0)
            try:
                info = await phases.build(run, worker, spec)
                await phases.own_swap(worker)
            except PhaseFailed as exc:
                if await self._fit_to_keep(worker, exc):
                    exc.standby, exc.recycled = held.keep(), worker.recycled + 1
                raise
            except Exception as exc:
                raise PhaseFailed("load", str(exc)) from exc
            return Built(held.keep(), info, swapped=True)

    def _worker(
        self,
        run: RunPhase,
        standby: Worker | None,
        *,
        fresh: bool,
        code: dict[str, Any] | None,
    ) -> Any:
        """The standby, owned by the build from here on, or a new worker (the spawn phase)."""
        name = "fresh_spawn" if fresh else "spawn"
        if standby is None:
            return self.workers.spawning(code, phase=name, run=run)
        self.workers.adopt(standby)
        how = (
            f"recycled after serving (reuse {standby.recycled})"
            if standby.recycled
            else "started ahead of time"
        )

        async def taken() -> Ran[None]:
            return Ran(f"standby worker pid {standby.pid}, {how}")

        return _after(run(name, taken), self.workers.owned(standby))

    async def _fit_to_keep(self, worker: Worker, exc: PhaseFailed) -> bool:
        """A fresh standby whose build raised in the user's code (a broken save: it answered
        with the error) stays the standby, so the fixed save reloads as fast as ever. On the
        CPU only: an exception there leaves the process as it was, while a CUDA error can
        poison the context for good. A reused worker goes unless the error is one any process
        would raise (a syntax error): its failure may be the reuse itself (see `build`).
        A build past its deadline, or a worker that died, goes too."""
        if not (
            isinstance(exc.__cause__, WorkerReplyError)
            and exc.phase in ("load", "warm", "smoke")
            and worker.device == "cpu"
            and (worker.recycled == 0 or not _may_be_reuse(exc))
            and worker.alive
        ):
            return False
        return await self._recycle(worker) is not None

    # ------------------------------------------------------------------ the old worker

    async def switch(self, built: Built) -> None:
        """Nothing to do: the new worker switched on its own side when it was built."""

    async def retire(self, old: Worker, gone: str | None, keep: bool) -> Retired:
        """The release phase: a killed old worker's requests are retried on the new one; a
        healthy one becomes the next standby (`keep`: the model wants one and none waits),
        or is stopped."""
        if gone:
            await old.end()
            return Retired(f"old worker pid {old.pid} killed ({gone})")
        freed = await self._recycle(old) if keep else None
        if freed is not None:
            mib = f" ({freed / (1024 * 1024):.0f} MiB of device memory freed)" if freed else ""
            detail = (
                f"old worker pid {old.pid} kept as the next standby after serving (reuse "
                f"{old.recycled + 1} of {self.st.model.recycle}), its versions dropped{mib}"
            )
            return Retired(detail, standby=old, recycled=old.recycled + 1)
        await old.end(self.st.model.deadlines.stop_s)
        return Retired(f"old worker pid {old.pid} stopped")

    async def _recycle(self, old: Worker) -> int | None:
        """The worker drops its versions to become the next standby: the next reload then
        pays for neither a process start nor torch's import, which would compete with
        serving for ~2 s of CPU. Up to `recycle` times per process. Returns the device
        memory freed, or None when it is not to be reused (the caller stops it)."""
        model = self.st.model
        if (
            self.fresh
            or self.st.record.recycle_off is not None
            or not model.standby
            or old.recycled >= model.recycle
            or not old.alive
        ):
            return None
        try:
            r = await old.retire(RetireRequest(), model.deadlines.stop_s)
        except (WorkerDied, WorkerReplyError, TimeoutError):
            return None  # not fit to keep
        return r.freed_bytes


def _with_reimport(spec: BuildSpec, reimport: bool) -> BuildSpec:
    return spec if spec.reimport == reimport else dataclasses.replace(spec, reimport=reimport)


class _after:
    """`async with _after(aw, cm)`: await `aw`, then enter `cm` (the standby's phase, then
    its ownership), one context manager like `WorkerFactory.spawning`."""

    def __init__(self, aw: Any, cm: Any) -> None:
        self._aw, self._cm = aw, cm

    async def __aenter__(self) -> Held:
        try:
            await self._aw
        except BaseException:
            async with self._cm:
                raise
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cm.__aexit__(*exc)


def _may_be_reuse(exc: PhaseFailed) -> bool:
    """Could this load failure come from importing the code a second time in one process?"""
    cause = exc.__cause__
    return isinstance(cause, WorkerReplyError) and cause.error_type not in DETERMINISTIC_ERRORS

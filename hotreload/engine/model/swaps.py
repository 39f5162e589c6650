"""How traffic moves from the old version to the new one, once it is built: the swap and
what surrounds it, each written once. The supervisor picks one (supervisor.py `_reload`, `_push`):

    swap_in     a version built in the serving worker swaps behind the requests already
                sent to it (phases.in_band); one built in another worker is handed over:
                it takes new requests at once while the old one finishes its own (swap,
                drain, sync, release)
    quiesce     the resource policy's start: gate, drain, sync (then offload, build,
                `behind_gate`, resume)

Each takes the phase runner and the model's state (state.py, the one writer), and returns
what became of the old worker (`Retired`) for the supervisor to act on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

from hotreload.config.models import Deadlines
from hotreload.engine import event_kinds
from hotreload.engine.event_kinds import RestoreFailed
from hotreload.engine.model import phases
from hotreload.engine.model.built import Built, Retired
from hotreload.engine.model.inplace import InPlace
from hotreload.engine.model.jobs import PhaseFailed, Ran, ReloadOutcome, Wedged
from hotreload.engine.model.phases import RunPhase
from hotreload.engine.model.respawn import Respawn
from hotreload.engine.model.state import ModelState
from hotreload.engine.router import StoppedStreams
from hotreload.engine.worker_port import Worker

Strategy = InPlace | Respawn


async def swap_in(
    run: RunPhase,
    st: ModelState,
    strategy: Strategy,
    old: Worker,
    built: Built,
    outcome: ReloadOutcome,
) -> Retired | None:
    """Traffic to a version built beside the serving one. In band when the serving worker
    built it (nothing retires). Else handed over: two processes, both versions resident,
    the new worker takes requests at once and the old one finishes its own, then has its
    streams synced and is retired. Nothing rolls back: a drain or sync that fails only
    means the old worker is killed (its requests are retried on the new one)."""
    if built.worker is old:
        install = functools.partial(
            st.install, built.worker, built.info, announce=False, open_gate=False
        )
        await phases.in_band(
            run, built.worker, st.model.deadlines, st.router, install, version=built.info.version
        )
        return None
    new, router, d = built.worker, st.router, st.model.deadlines

    async def swap() -> Ran[None]:
        st.install(new, built.info, announce=False, handover=True)
        return Ran(
            f"new requests go to worker pid {new.pid}; "
            f"{router.draining} still in flight on pid {old.pid}"
        )

    async with retiring(st, old):
        await run("swap", swap)
        gone: str | None = None
        try:
            await run(
                "drain",
                lambda: drain(
                    router.drain_previous,
                    lambda: router.draining,
                    d,
                    lambda: router.end_streams(built.info.version, d.drain_s, worker=old),
                    "old worker",
                ),
            )
            # Its requests done on the serving CPUs (moved now, they would wait for a CPU
            # behind the session's own work): the rest of its life is reload work.
            st.workers.place(old, serving=False)
            await run("sync", lambda: phases.sync(old, d.sync_s))
        except PhaseFailed as exc:
            gone = "died" if not old.alive else "wedged" if isinstance(exc, Wedged) else "failed"
            if gone == "wedged":
                st.blame_hung(old)  # retire kills it: the request that hung is the one told
            why = {"model": st.name, "phase": exc.phase, "detail": f"{exc}; old worker abandoned"}
            st.events.emit(
                event_kinds.Wedged(**why) if gone == "wedged" else event_kinds.WorkerLost(**why)
            )
            outcome.detail.append(f"old worker {gone} in {exc.phase}: abandoned")
        return await retire(run, st, strategy, old, gone)


async def drain(
    wait: Callable[[float], Awaitable[bool]],
    running: Callable[[], int],
    d: Deadlines,
    end_streams: Callable[[], StoppedStreams],
    on: str | None = None,
) -> Ran[None]:
    """The drain phase: wait, to the drain deadline, for the requests in flight (`on` the
    old worker of a hand-over); past it a forward is hung and the worker wedged. Streams
    still running at `drain_s` are ended (`end_streams`, phases.drain_streams)."""
    n, where = running(), f" on the {on}" if on else ""
    drained, ended = await phases.drain_streams(wait, d, end_streams)
    if not drained:
        raise Wedged(
            "drain",
            f"{running()} request(s) still running{where} after the {d.drain_wait_s:g} s "
            "drain deadline: a forward is hung",
        )
    done = f"{n} request(s) finished{where}" if on else f"{n} request(s) in flight"
    return Ran(done + phases.ended_text(ended, d))


async def quiesce(run: RunPhase, st: ModelState, worker: Worker) -> None:
    """Stop admission, wait for the requests in flight, then for the old streams."""
    router, d = st.router, st.model.deadlines

    async def gate() -> None:
        st.close_gate()

    await run("gate", gate, state="draining")
    to = st.record.next_version  # what a stream ended at the drain deadline is told

    def end_streams() -> StoppedStreams:
        return router.end_streams(to, d.drain_s)

    await run("drain", lambda: drain(router.drain, lambda: router.inflight, d, end_streams))
    await run("sync", lambda: phases.sync(worker, d.sync_s))


async def behind_gate(
    run: RunPhase, st: ModelState, strategy: Strategy, old: Worker, built: Built
) -> Retired | None:
    """The resource policy's end: swap while the gate is closed, resume, and retire the old
    worker when the version was built in another one."""

    async def swap() -> None:
        await strategy.switch(built)
        st.install(built.worker, built.info, announce=False, open_gate=False)

    async def resume() -> None:
        st.open_gate()
        st.set_state("serving", version=st.record.version)

    async with retiring(st, old if built.worker is not old else None):
        await run("swap", swap)
        await run("resume", resume)
        if built.worker is old:
            return None
        return await retire(run, st, strategy, old, None)


async def restore(st: ModelState, old: Worker) -> None:
    """Resource policy, after a failed build: the offloaded old version back, serving. A
    worker that died, or cannot restore, is left dead: the supervisor restarts it."""
    if not old.alive:
        return
    why = await phases.restore(old, st.model.deadlines.load_s)
    if why is not None:
        st.events.emit(RestoreFailed(model=st.name, error=why))
        return
    st.open_gate()


async def retire(
    run: RunPhase, st: ModelState, strategy: Strategy, old: Worker, gone: str | None
) -> Retired:
    """The release phase of a worker a swap replaced: the strategy says what becomes of it
    (killed, kept as the next standby, stopped)."""

    async def release() -> Ran[Retired]:
        retired = await strategy.retire(old, gone, st.record.standby is None)
        return Ran(retired.detail, retired)

    return (await run("release", release)).value


@contextlib.asynccontextmanager
async def retiring(st: ModelState, old: Worker | None) -> AsyncIterator[None]:
    """From the swap on, the old worker is neither the serving one nor the standby: the
    reload owns it (WorkerFactory.owned) until the release phase has stopped, killed or kept
    it, so if the reload stops before (cancelled at shutdown, a bug of ours) it goes too."""
    st.set_retiring(old)
    try:
        if old is None:
            yield
            return
        async with st.workers.owned(old) as held:
            yield
            held.keep()
    finally:
        st.set_retiring(None)

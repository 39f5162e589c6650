"""Which CPUs serve and which do everything else (`cpus` in a model's config).

A reload's work (the standby worker's build, the manager's orchestration, the old worker's
drain and retirement) is short, but on a machine with few cores the kernel's scheduler puts
part of it on the core the serving worker is running on, and every request queued behind
the serving thread then waits for it: measured on 2 cores at 32 clients, the serving
thread's wait for a CPU went from 0.01 ms to 0.2-0.5 ms per request inside reload windows
(docs/benchmarks.md). Pinning the serving worker to CPUs of its own and everything else to
the rest keeps that work off the serving path, the same isolation `taskset` and `numactl`
give a production model server.

The plan is made once per session. `auto` gives a model as many CPUs as its torch intra-op
threads, taken from the highest-numbered free ones, and only while at least one CPU is left
for the rest. A CPU is claimed with an advisory lock on a file in the folder of the reload
locks (this user's own, 0700: engine/locks.py), held for the session's life (the kernel drops
it when the process dies), so two sessions of one user never pin their serving workers to the
same core. Another user can neither see nor hold these claims: in a shared folder anyone
could have held them all.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hotreload.config import ModelConfig
from hotreload.engine.locks import default_lock_dir, mark_holder, open_lock_file
from hotreload.errors import ConfigError

#: Linux only: elsewhere `cpus` stays "off" (an explicit list is then a config error).
SUPPORTED = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


@dataclass
class CpuPlan:
    """Who runs where for one session. Empty `serving`: nothing is pinned."""

    #: Model name -> the CPUs its serving worker runs on.
    serving: dict[str, frozenset[int]] = field(default_factory=dict)
    #: Everything else: the manager, standby and retiring workers, in-place builds.
    rest: frozenset[int] = frozenset()
    #: One line per model that is not pinned, saying why (for the start-up banner).
    notes: list[str] = field(default_factory=list)
    #: Model name -> (in a few words, in full) why `cpus = "auto"` pinned it nowhere: the
    #: dashboard's narrow panel shows the first, `hotreload status` the second.
    unpinned: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: The claim files' descriptors (the locks live as long as these).
    claims: list[int] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for fd in self.claims:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.claims.clear()

    def describe(self) -> str:
        if not self.serving:
            return "; ".join(self.notes) or "no model pinned"
        parts = [f"{name} serves on CPU {format_cpus(c)}" for name, c in self.serving.items()]
        return (
            "; ".join(parts)
            + f"; the session, reloads and standby workers on CPU {format_cpus(self.rest)}"
            + "".join(f"; {n}" for n in self.notes)
        )


def format_cpus(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5" (the kernel's own list format, as `taskset -c` takes it)."""
    out = []
    # Consecutive CPUs share their distance from their rank in the sorted list.
    for _, run in itertools.groupby(enumerate(sorted(cpus)), key=lambda rc: rc[1] - rc[0]):
        first, *rest = (c for _, c in run)
        out.append(f"{first}-{rest[-1]}" if rest else str(first))
    return ",".join(out)


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask, which honours cgroup cpusets)."""
    return frozenset(os.sched_getaffinity(0)) if SUPPORTED else frozenset()


def _try_claim(folder: Path, cpu: int) -> int | None:
    """A lock on `cpu` for this process's life (its descriptor), or None if another session
    holds it. The file names the holder's pid, as the reload locks do."""
    try:
        fd = open_lock_file(folder, f"cpu{cpu}")
    except OSError:
        return None  # no descriptors left, say: unclaimed (a bad folder raises HotreloadError)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    with contextlib.suppress(OSError):
        mark_holder(fd)
    return fd


def plan_cpus(
    models: Iterable[ModelConfig],
    available: frozenset[int],
    *,
    folder: Path | None = None,
) -> CpuPlan:
    """Claim serving CPUs for each model (see the module docstring). Raises ConfigError for
    an explicit list this machine cannot honour."""
    plan = CpuPlan()
    wanted = [m for m in models if m.cpus != "off"]
    if not wanted:
        return plan
    if not SUPPORTED:
        explicit = [m.name for m in wanted if m.cpus != "auto"]
        if explicit:
            raise ConfigError(
                f"models.{explicit[0]}.cpus: pinning to CPUs needs Linux; "
                'remove the key or set cpus = "auto"'
            )
        return plan
    folder = folder or default_lock_dir()
    taken: set[int] = set()  # ours and other sessions'
    try:
        for m in wanted:
            if m.cpus != "auto":
                _claim_explicit(plan, m, available, folder, taken)
        for m in wanted:
            if m.cpus == "auto":
                _claim_auto(plan, m, available, folder, taken)
    except BaseException:
        plan.release()
        raise
    if plan.serving:
        ours = frozenset().union(*plan.serving.values())
        # Off other sessions' serving CPUs too, when that still leaves one.
        plan.rest = (available - taken) or (available - ours)
    return plan


def cpus_problem(m: ModelConfig, available: frozenset[int]) -> str | None:
    """Why an explicit `cpus` list cannot be honoured here (CPUs this process may not use),
    or None. Checked before start-up (hotreload/preflight.py) and again when claiming."""
    if not isinstance(m.cpus, tuple):
        return None
    missing = frozenset(m.cpus) - available
    if not missing:
        return None
    return (
        f"CPU {format_cpus(missing)} is not available to this process (it may use "
        f'CPU {format_cpus(available)}); pick from those or set cpus = "auto"'
    )


def _claim_explicit(
    plan: CpuPlan, m: ModelConfig, available: frozenset[int], folder: Path, taken: set[int]
) -> None:
    assert isinstance(m.cpus, tuple)
    cpus = frozenset(m.cpus)
    key = f"models.{m.name}.cpus"
    problem = cpus_problem(m, available)
    if problem:
        raise ConfigError(f"{key}: {problem}")
    for other, theirs in plan.serving.items():
        if cpus & theirs:
            raise ConfigError(
                f"{key}: CPU {format_cpus(cpus & theirs)} already serves model {other!r}; "
                "give each model CPUs of its own"
            )
    if not available - taken - cpus:
        raise ConfigError(
            f"{key}: CPU {format_cpus(cpus)} leaves no CPU for the session and reloads "
            f"(this process may use CPU {format_cpus(available)}); leave at least one out"
        )
    shared = []
    for cpu in sorted(cpus):
        fd = _try_claim(folder, cpu)
        if fd is None:
            shared.append(cpu)
        else:
            plan.claims.append(fd)
    taken.update(cpus)
    plan.serving[m.name] = cpus
    if shared:
        plan.notes.append(
            f"{m.name}: CPU {format_cpus(shared)} also serves another hotreload session"
        )


def _unpinned(plan: CpuPlan, name: str, short: str, why: str) -> None:
    plan.unpinned[name] = (short, why)
    plan.notes.append(f"{name} not pinned: {why}")


def _claim_auto(
    plan: CpuPlan, m: ModelConfig, available: frozenset[int], folder: Path, taken: set[int]
) -> None:
    if m.threads is None:
        _unpinned(
            plan,
            m.name,
            "threads unset",
            "`threads` is not set, so torch would use every core "
            "(set threads = N to give it N CPUs of its own)",
        )
        return
    need = m.threads.intra_op
    got: dict[int, int] = {}  # cpu -> its claim's descriptor
    for cpu in sorted(available - taken, reverse=True):
        if len(got) == need:
            break
        # Always leave one CPU that no session serves on, for the rest.
        if not available - taken - got.keys() - {cpu}:
            break
        fd = _try_claim(folder, cpu)
        if fd is None:
            taken.add(cpu)  # another session's
            continue
        got[cpu] = fd
    if len(got) < need:
        for fd in got.values():
            os.close(fd)
        _unpinned(
            plan,
            m.name,
            "no spare CPU",
            f"it needs {need} CPU(s) of its own plus one for the rest, "
            f"and {len(available - taken)} of CPU {format_cpus(available)} are free",
        )
        return
    plan.claims.extend(got.values())
    taken.update(got)
    plan.serving[m.name] = frozenset(got)


def pin_process(pid: int, cpus: frozenset[int]) -> bool:
    """Move every thread of `pid` onto `cpus`; threads started later inherit their creator's
    mask. False when the process is gone or the kernel refused a thread."""
    done: set[int] = set()
    ok = True
    # Twice: a thread started while we walk the list inherits its creator's old mask.
    for _ in range(2):
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - done
        except OSError:
            return False  # the process is gone
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass  # that thread just ended
            except OSError:
                ok = False  # not allowed: the others still move
        done |= tids
    return ok


def pin_self(cpus: frozenset[int]) -> bool:
    """The manager process, every thread of it (the HTTP server, telemetry, file threads)."""
    return pin_process(os.getpid(), cpus)

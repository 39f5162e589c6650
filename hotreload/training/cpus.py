"""Keep a trainer off the CPUs the session's serving workers run on.

With `cpus = "auto"` the session pins each serving worker to CPUs of its own
(engine/cpus.py), but a trainer in another process knows nothing of it: torch starts one
thread per core, and the kernel puts some of them on the serving CPU, where every eval
call then waits behind a training thread. `keep_off_serving_cpus()` asks the session which
workers serve, reads the CPUs each is pinned to (its affinity, as the session set it),
and moves every thread of this process onto the others, with torch's intra-op thread
count set to match. Where nothing is pinned, or nothing would be left, it changes nothing
and says why.

    from hotreload.training import keep_off_serving_cpus
    print(keep_off_serving_cpus(config="hotreload.toml"))   # before training starts

No torch import: torch is set up only when the trainer imported it already (else
OMP_NUM_THREADS is set, which torch reads when it is imported).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from hotreload.client import Client
from hotreload.engine.cpus import SUPPORTED, available_cpus, format_cpus, pin_process


@dataclass(frozen=True)
class CpuMove:
    """What `keep_off_serving_cpus` did. `str()` is the sentence to print."""

    #: The CPUs the serving workers hold (those the trainer now keeps off).
    serving: frozenset[int] = frozenset()
    #: The CPUs the trainer runs on now (empty: unchanged).
    trainer: frozenset[int] = frozenset()
    #: torch's intra-op thread count set (None: unchanged).
    threads: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def moved(self) -> bool:
        return bool(self.trainer)

    def __str__(self) -> str:
        if not self.moved:
            return "trainer left where it runs: " + "; ".join(self.notes)
        text = (
            f"trainer moved to CPU {format_cpus(self.trainer)}, off CPU "
            f"{format_cpus(self.serving)} where the serving workers run"
        )
        if self.threads is not None:
            text += f"; torch intra-op threads: {self.threads}"
        return "; ".join([text, *self.notes])


def serving_cpus(status: dict[str, Any]) -> tuple[frozenset[int], list[str]]:
    """The CPUs the serving workers of a session's `status` are pinned to, and notes on
    those that are not (a worker allowed on every CPU this process may use holds none)."""
    mine = available_cpus()
    held: set[int] = set()
    notes: list[str] = []
    for m in status.get("models", []):
        pid = m.get("pid")
        if pid is None:
            notes.append(f"model {m.get('name')!r} has no serving worker")
            continue
        try:
            cpus = frozenset(os.sched_getaffinity(int(pid)))
        except OSError:
            notes.append(f"model {m.get('name')!r}: its worker (pid {pid}) is gone")
            continue
        if mine <= cpus:
            why = m.get("cpus_unpinned") or 'its config has cpus = "off"'
            notes.append(f"model {m.get('name')!r} is not pinned ({why})")
            continue
        held |= cpus
    return frozenset(held), notes


def keep_off_serving_cpus(
    client: Client | None = None,
    *,
    config: str | os.PathLike[str] | None = None,
    socket_path: str | os.PathLike[str] | None = None,
    set_torch_threads: bool = True,
) -> CpuMove:
    """Move this process (every thread) off the CPUs the session's serving workers are
    pinned to, and set torch's intra-op threads to the CPUs left. Returns what it did; a
    no-op, with a note saying why, when nothing is pinned or no CPU would be left."""
    if not SUPPORTED:
        return CpuMove(notes=["CPU affinity needs Linux"])
    own = client is None
    client = client or Client(config, socket_path=socket_path)
    try:
        serving, notes = serving_cpus(client.status())
    finally:
        if own:
            client.close()
    mine = available_cpus()
    if not serving:
        return CpuMove(notes=notes or ["no serving worker is pinned to CPUs of its own"])
    left = mine - serving
    if not left:
        return CpuMove(
            serving,
            notes=[
                *notes,
                f"the serving workers hold CPU {format_cpus(serving)}, every CPU this "
                f"process may use ({format_cpus(mine)}): none to spare",
            ],
        )
    if not pin_process(os.getpid(), left):
        notes.append("some threads could not be moved (they ended, or the kernel refused)")
    threads = _set_threads(len(left), notes) if set_torch_threads else None
    return CpuMove(serving, left, threads, notes)


def _set_threads(n: int, notes: list[str]) -> int | None:
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ["OMP_NUM_THREADS"] = str(n)
        notes.append(f"torch is not imported yet: OMP_NUM_THREADS={n} is set for it")
        return None
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        pass  # fixed once inter-op work ran; intra-op threads are the ones that matter
    return n

"""What a strategy hands back to the supervisor (strategies return values; they never call
back): the worker with the new version built, and what became of the old one."""

from __future__ import annotations

from dataclasses import dataclass, field

from hotreload.engine.model.record import VersionInfo
from hotreload.engine.worker_port import Worker


@dataclass
class Built:
    """What a strategy built: the worker with the new version staged or swapped in."""

    worker: Worker
    info: VersionInfo
    #: The worker switched to the version on its own side already (a worker of its own);
    #: False: it is staged beside the version the same worker serves (inplace).
    swapped: bool
    #: What the build noted for the outcome (a retry in a fresh process).
    detail: list[str] = field(default_factory=list)


@dataclass
class Retired:
    """What became of the old worker or version after a swap (the release phase)."""

    #: What became of it, for the release phase's row.
    detail: str
    #: The old worker, kept as the next standby (respawn), with its reuse count.
    standby: Worker | None = None
    recycled: int = 0

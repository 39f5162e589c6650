"""Which order a reload runs its phases in: load next to the old version (availability),
or unload it first (resource). `auto` picks availability when free memory covers the last
measured footprint with margin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import psutil

from hotreload.config import ModelConfig
from hotreload.engine.event_kinds import Policy
from hotreload.engine.events import EventBus
from hotreload.engine.memory_limits import cgroup_memory
from hotreload.engine.model.phases import MIB
from hotreload.engine.model.record import VersionInfo
from hotreload.engine.worker_port import Worker
from hotreload.protocol.messages import StatusReply

#: Headroom `auto` wants above the new version's footprint before it loads next to the old.
AUTO_MARGIN_BYTES = 256 * MIB
AUTO_MARGIN_RATIO = 0.2


async def choose_policy(
    model: ModelConfig,
    current: VersionInfo | None,
    worker: Worker | None,
    worker_status: Callable[[], Awaitable[StatusReply | None]],
    events: EventBus,
) -> str:
    """The policy of the next reload, said with why as a `policy` event."""
    policy, reason = await _choose(model, current, worker, worker_status)
    events.emit(Policy(model=model.name, policy=policy, reason=reason))
    return policy


async def _choose(
    model: ModelConfig,
    current: VersionInfo | None,
    worker: Worker | None,
    worker_status: Callable[[], Awaitable[StatusReply | None]],
) -> tuple[str, str]:
    configured = model.policy
    if configured != "auto":
        return configured, "set in the config"
    need = current.footprint_bytes if current else 0
    # Only a GPU worker reports device memory; asking a CPU one costs its serving thread a
    # moment of the GIL for nothing.
    on_cpu = worker is not None and worker.device == "cpu"
    status = None if on_cpu else await worker_status()
    memory = status.device_memory if status is not None else None
    if memory:
        free, where = int(memory["free_bytes"]), f"{worker.device if worker else ''}"
    else:
        free, where = host_memory_free()
    margin = max(AUTO_MARGIN_BYTES, int(need * AUTO_MARGIN_RATIO))
    figures = f"{free / MIB:.0f} MiB free on {where}, last version used {need / MIB:.0f} MiB"
    if free >= need + margin:
        return "availability", f"auto: {figures}: load next to the old version"
    return "resource", f"auto: {figures} (+{margin / MIB:.0f} MiB margin): unload first"


def host_memory_free() -> tuple[int, str]:
    """Free host memory for a CPU model's next version, and where it was measured: the
    host's available RAM, or what the session's cgroup limit leaves when that is less (a
    container with 2 GiB on a 512 GiB host is out of memory at 2 GiB)."""
    free, where = psutil.virtual_memory().available, "host RAM"
    limit = cgroup_memory()
    if limit is not None and limit.free_bytes < free:
        free = limit.free_bytes
        where = f"the cgroup memory limit ({limit.limit_bytes / MIB:.0f} MiB, {limit.where})"
    return free, where

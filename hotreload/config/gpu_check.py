"""The `[gpu]` table (GPU reset, sampling) and the `[check]` table (`hotreload check`)."""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config.checker import Checker

RESET_MODES = ("never", "on-wedge", "ask")


@dataclass(frozen=True)
class GpuConfig:
    #: GPU reset: `"never"`, `"on-wedge"` (tried when a worker wedged, only when safe) or
    #: `"ask"` (the dashboard's `x` key asks first). Dev machines only.
    reset: str = "never"
    #: How often GPU memory and utilisation are read (NVML).
    sample_interval_ms: int = 500


@dataclass(frozen=True)
class CheckConfig:
    #: Reload cycles `hotreload check` runs after the first load (`--reloads` overrides it).
    reloads: int = 3
    #: Memory growth after a reload, against the first load, that fails `hotreload check`.
    leak_threshold_mib: float = 64.0
    #: Fail the check when p99 over a burst of requests exceeds this (`--p99-ms`). Unset: no
    #: latency check.
    p99_ms: float | None = None
    #: How many requests the `p99_ms` burst sends.
    burst_requests: int = 200


def parse_gpu(top: Checker) -> GpuConfig:
    """`[gpu]` from the top-level table (every key optional)."""
    g = top.subtable("gpu", tuple(GpuConfig.__dataclass_fields__))
    return GpuConfig(
        reset=g.choice("reset", "never", RESET_MODES),
        sample_interval_ms=g.integer("sample_interval_ms", 500, minimum=50, maximum=60_000),
    )


def parse_check(top: Checker) -> CheckConfig:
    """`[check]` from the top-level table (every key optional)."""
    c = top.subtable("check", tuple(CheckConfig.__dataclass_fields__))
    return CheckConfig(
        reloads=c.integer("reloads", 3, minimum=0, maximum=1000),
        leak_threshold_mib=c.number("leak_threshold_mib", 64.0, minimum=0.0) or 0.0,
        p99_ms=c.number("p99_ms", None, minimum=0.001),
        burst_requests=c.integer("burst_requests", 200, minimum=1, maximum=1_000_000),
    )

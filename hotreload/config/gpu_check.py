"""The `[gpu]` table (GPU reset, sampling) and the `[check]` table (`hotreload check`)."""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config.checker import Checker

RESET_MODES = ("never", "on-wedge", "ask")


@dataclass(frozen=True)
class GpuConfig:
    reset: str = "never"
    sample_interval_ms: int = 500


@dataclass(frozen=True)
class CheckConfig:
    reloads: int = 3
    #: Memory growth after a reload, against the first load, that fails `hotreload check`.
    leak_threshold_mib: float = 64.0
    p99_ms: float | None = None
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

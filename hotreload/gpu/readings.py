"""NVML readings as frozen dataclasses: what widgets and the engine read, never the hardware.

Re-exported by `hotreload.gpu.nvml`; kept apart so the gateway module stays readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU as NVML sees it (host PID)."""

    pid: int
    #: Memory NVML attributes to it; None where NVML cannot tell (WSL, some containers).
    used_memory_bytes: int | None
    #: True when the PID is one of hotreload's own worker processes.
    is_hotreload_worker: bool


@dataclass(frozen=True)
class GpuDevice:
    """One GPU at the moment of a reading."""

    index: int
    name: str
    uuid: str
    #: NVML's bus id, e.g. "00000000:01:00.0".
    pci_bus_id: str
    memory_total: int
    memory_used: int
    #: Memory reserved by the driver (`nvmlMemory_v2`); None on drivers without the v2 call.
    memory_reserved: int | None
    utilization_pct: int | None
    temperature_c: int | None
    power_w: float | None
    processes: tuple[GpuProcess, ...]
    #: Driver's recommended recovery action ("none", "GPU reset required", ...) where known.
    recovery_action: str | None
    #: Why this device's figures are missing (e.g. "GPU lost ..."); None when it read fine.
    problem: str | None = None

    @property
    def bus(self) -> tuple[int, int, int] | None:
        """The bus id normalised to (domain, bus, device), comparable with kernel log ids."""
        return normalize_bus_id(self.pci_bus_id)

    @property
    def memory_free(self) -> int:
        return max(self.memory_total - self.memory_used, 0)


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything NVML said at one moment; `available=False` carries the reason instead."""

    taken_at: float
    available: bool
    reason: str | None
    driver_version: str | None
    #: CUDA version the driver supports, e.g. "12.4".
    cuda_driver_version: str | None
    devices: tuple[GpuDevice, ...]
    #: Machine-readable twin of `reason` ("library_not_found", "driver_not_loaded", ...).
    reason_kind: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuSnapshot:
        """The inverse of `dataclasses.asdict` after a JSON round trip (lists back to tuples)."""
        devices = tuple(
            GpuDevice(**{**dev, "processes": tuple(GpuProcess(**p) for p in dev["processes"])})
            for dev in d["devices"]
        )
        return cls(**{**d, "devices": devices})


def normalize_bus_id(text: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) from NVML's "00000000:01:00.0" or the kernel's "PCI:0000:01:00",
    "0000:01:00" or "01:00"; None when the id is redacted or not hex."""
    if not text:
        return None
    s = text.strip()
    if s[:4].upper() == "PCI:":
        s = s[4:]
    s = s.split(".", 1)[0]  # the function number is not part of the kernel's form
    parts = s.split(":")
    try:
        if len(parts) == 3:
            return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
        if len(parts) == 2:
            return 0, int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None
    return None


def format_cuda_version(value: int) -> str:
    """The CUDA version as people write it ("12.4") from its integer form (12040)."""
    return f"{value // 1000}.{(value % 1000) // 10}"

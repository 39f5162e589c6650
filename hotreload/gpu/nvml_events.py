"""NVML's event API (Xid critical errors, ECC, recovery action), used by the Xid monitor."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hotreload.gpu.nvml import REINIT_KINDS, NvmlGateway, NvmlUnavailable

#: (pynvml attribute, fallback value) of the event types the Xid monitor asks for.
EVENT_TYPES: dict[str, tuple[str, int]] = {
    "xid": ("nvmlEventTypeXidCriticalError", 0x0008),
    "dbe": ("nvmlEventTypeDoubleBitEccError", 0x0002),
    "sbe_storm": ("nvmlEventTypeSingleBitEccErrorStorm", 0x0200),
    "recovery_action": ("nvmlEventTypeGpuRecoveryAction", 0x8000),
}


@dataclass(frozen=True)
class NvmlEvent:
    """One event from `nvmlEventSetWait`, resolved to a device index and bus id."""

    kind: str  # "xid", "dbe", "sbe_storm", "recovery_action" or "other"
    data: int
    device_index: int | None
    pci_bus_id: str | None


class NvmlEventSet:
    """An NVML event set registered on every device that supports the wanted events."""

    def __init__(self, gw: NvmlGateway) -> None:
        self._gw = gw
        nvml = gw.ensure()
        self._masks = {
            name: int(getattr(nvml, attr, default)) for name, (attr, default) in EVENT_TYPES.items()
        }
        self._handle = gw.call("nvmlEventSetCreate")
        self.registered: dict[int, list[str]] = {}
        self._bus_by_index: dict[int, str] = {}
        wanted = 0
        for m in self._masks.values():
            wanted |= m
        try:
            for i in range(gw.device_count()):
                h = gw.handle(i)
                try:
                    supported = int(gw.call("nvmlDeviceGetSupportedEventTypes", h))
                except NvmlUnavailable as err:
                    if err.kind in REINIT_KINDS:
                        raise
                    supported = self._masks["xid"]
                mask = wanted & supported
                if not mask:
                    continue
                try:
                    gw.call("nvmlDeviceRegisterEvents", h, mask, self._handle)
                except NvmlUnavailable as err:
                    if err.kind in REINIT_KINDS:
                        raise
                    continue
                self.registered[i] = [n for n, m in self._masks.items() if m & mask]
                with contextlib.suppress(NvmlUnavailable):
                    self._bus_by_index[i] = gw.pci_bus_id(h)
        except NvmlUnavailable:
            self.free()
            raise

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        """The next event, None on timeout; NvmlUnavailable when the set is broken."""
        try:
            data = self._gw.call_versioned(
                [
                    ("nvmlEventSetWait_v2", (self._handle, timeout_ms), {}),
                    ("nvmlEventSetWait", (self._handle, timeout_ms), {}),
                ]
            )
        except NvmlUnavailable as err:
            if err.kind == "timeout":
                return None
            raise
        etype = int(data.eventType)
        kind = next((n for n, m in self._masks.items() if etype & m), "other")
        index: int | None
        try:
            index = int(self._gw.call("nvmlDeviceGetIndex", data.device))
        except NvmlUnavailable:
            index = None
        bus = self._bus_by_index.get(index) if index is not None else None
        return NvmlEvent(kind, int(data.eventData), index, bus)

    def free(self) -> None:
        with contextlib.suppress(NvmlUnavailable):
            self._gw.call("nvmlEventSetFree", self._handle)

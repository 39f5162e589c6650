"""One scripted fake of the `pynvml` module, injected at the gateway seam.

`FakeNvml` implements the slice of nvidia-ml-py the gateway uses, with the same error class
names (`NVMLError_GpuIsLost`, ...) so the gateway's translation is exercised for real. A test
scripts devices, failures and events on it; nothing else is mocked.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from hotreload.gpu import nvml

ERROR_NAMES = (
    "Uninitialized",
    "InvalidArgument",
    "NotSupported",
    "NoPermission",
    "NotFound",
    "DriverNotLoaded",
    "Timeout",
    "LibraryNotFound",
    "FunctionNotFound",
    "GpuIsLost",
    "LibRmVersionMismatch",
    "Unknown",
)


class NVMLError(Exception):
    """Base of the fake's errors, like pynvml.NVMLError."""


ERRORS: dict[str, type[NVMLError]] = {
    name: type(f"NVMLError_{name}", (NVMLError,), {}) for name in ERROR_NAMES
}

XID_EVENT = 0x0008
DBE_EVENT = 0x0002
RECOVERY_EVENT = 0x8000


@dataclass
class FakeDevice:
    name: str = "NVIDIA Fake 24GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:01:00.0"
    total: int = 24 * 2**30
    used: int = 2 * 2**30
    reserved: int = 300 * 2**20
    util: int = 37
    temp: int = 55
    power_mw: int = 123_400
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    recovery_action: int | None = 0
    supported_events: int = XID_EVENT | DBE_EVENT | RECOVERY_EVENT
    lost: bool = False


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    """Stands in for the `pynvml` module (attributes looked up by name, like the real one)."""

    NVMLError = NVMLError
    #: Handy for tests, which take everything from the fixture instead of importing conftest.
    Device = FakeDevice
    ERROR_NAMES = ERROR_NAMES
    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x02000028
    nvmlEventTypeXidCriticalError = XID_EVENT
    nvmlEventTypeDoubleBitEccError = DBE_EVENT
    nvmlEventTypeSingleBitEccErrorStorm = 0x0200
    nvmlEventTypeGpuRecoveryAction = RECOVERY_EVENT

    def __init__(self, devices: list[FakeDevice] | None = None) -> None:
        for name, cls in ERRORS.items():
            setattr(self, f"NVMLError_{name}", cls)
        self.devices = devices if devices is not None else [FakeDevice()]
        #: Error name to raise from nvmlInit (e.g. "DriverNotLoaded"), or None.
        self.init_error: str | None = None
        #: Function name -> error name raised by every call to it.
        self.fail: dict[str, str] = {}
        self.driver_version = "550.54.15"
        self.cuda_version = 12040
        self.has_memory_v2 = True
        self.calls: list[str] = []
        self.init_count = 0
        self.shutdown_count = 0
        self.event_sets_created = 0
        self.registered: dict[int, int] = {}
        #: Items for nvmlEventSetWait: (device index, event type, data) or an error name.
        self.events: queue.Queue[tuple[int, int, int] | str] = queue.Queue()
        self.active_reads = 0
        self.max_concurrent_reads = 0
        self.read_delay_s = 0.0
        self._lock = threading.Lock()

    # -- helpers ------------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls.append(fn)
        if fn in self.fail:
            raise ERRORS[self.fail[fn]]()

    def _dev(self, handle: Handle) -> FakeDevice:
        dev = self.devices[handle.index]
        if dev.lost:
            raise ERRORS["GpuIsLost"]()
        return dev

    def push_event(self, index: int, etype: int, data: int) -> None:
        self.events.put((index, etype, data))

    def push_error(self, name: str) -> None:
        self.events.put(name)

    # -- session ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error:
            raise ERRORS[self.init_error]()
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdown_count += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    # -- devices ------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        with self._lock:
            self.active_reads += 1
            self.max_concurrent_reads = max(self.max_concurrent_reads, self.active_reads)
        try:
            if self.read_delay_s:
                threading.Event().wait(self.read_delay_s)
            return len(self.devices)
        finally:
            with self._lock:
                self.active_reads -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise ERRORS["InvalidArgument"]()
        self._dev(Handle(index))
        return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        self._enter("nvmlDeviceGetName")
        return self._dev(handle).name.encode()  # old nvidia-ml-py returned bytes

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self._dev(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        self._enter("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=self._dev(handle).bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""))
        dev = self._dev(handle)
        if version:
            if not self.has_memory_v2:
                raise ERRORS["FunctionNotFound"]()
            return SimpleNamespace(
                total=dev.total,
                used=dev.used,
                reserved=dev.reserved,
                free=dev.total - dev.used - dev.reserved,
            )
        return SimpleNamespace(total=dev.total, used=dev.used, free=dev.total - dev.used)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self._dev(handle).util, memory=0)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        return self._dev(handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        return self._dev(handle).power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._dev(handle).processes
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses")
        self._dev(handle)
        return []

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[int]) -> list[Any]:
        self._enter("nvmlDeviceGetFieldValues")
        dev = self._dev(handle)
        if dev.recovery_action is None:
            return [SimpleNamespace(nvmlReturn=3, value=SimpleNamespace(uiVal=0))]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=dev.recovery_action))]

    # -- events -------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        self.event_sets_created += 1
        self.registered = {}
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes")
        return self._dev(handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        self._dev(handle)
        self.registered[handle.index] = mask

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise ERRORS["Timeout"]() from None
        if isinstance(item, str):
            raise ERRORS[item]()
        index, etype, data = item
        return SimpleNamespace(device=Handle(index), eventType=etype, eventData=data)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree")


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """A FakeNvml wired into the process-wide gateway (with no retry delay)."""
    fake = FakeNvml()
    nvml.reset_gateway()
    monkeypatch.setattr(nvml, "_load_pynvml", lambda: fake)
    monkeypatch.setattr(nvml, "_gateway", nvml.NvmlGateway(load=lambda: fake, retry_interval_s=0))
    yield fake
    nvml.reset_gateway()


@pytest.fixture
def no_nvml_gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The real process-wide gateway, fresh (so earlier fakes leave nothing behind)."""
    nvml.reset_gateway()
    yield
    nvml.reset_gateway()

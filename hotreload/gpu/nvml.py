"""The NVML gateway: the only module that imports `pynvml` (nvidia-ml-py).

Every NVML call goes through `NvmlGateway.call`, which turns NVML errors into
`NvmlUnavailable` carrying a plain reason ("NVML library not found", "GPU lost", ...).
The library is loaded and initialised lazily on first use (so importing this module costs
nothing and never touches the driver) and shut down at interpreter exit.

Readings are frozen dataclasses (`GpuSnapshot`, `GpuDevice`, `GpuProcess`, in `readings`):
widgets and the engine read snapshots and never reach the hardware. `GpuSampler` (in
`sampler`, which imports this module, never the reverse) takes readings on one long-lived
thread at a fixed interval.

The seam for tests is `_load_pynvml`: a test swaps it (and calls `reset_gateway()`) to inject
one scripted fake `pynvml` module; nothing else is mocked.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from types import ModuleType
from typing import Any

from hotreload.gpu.nvml_errors import (
    FIELD_RECOVERY_ACTION,
    MISSING_KINDS,
    RECOVERY_ACTIONS,
    REINIT_KINDS,
    NvmlUnavailable,
    translate_error,
)
from hotreload.gpu.readings import (
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    format_cuda_version,
    normalize_bus_id,
)

log = logging.getLogger(__name__)

__all__ = [
    "RECOVERY_ACTIONS",
    "REINIT_KINDS",
    "GpuDevice",
    "GpuProcess",
    "GpuSnapshot",
    "NvmlGateway",
    "NvmlUnavailable",
    "free_memory_bytes",
    "gateway",
    "normalize_bus_id",
    "reset_gateway",
    "take_snapshot",
]


def _load_pynvml() -> ModuleType:
    """Import nvidia-ml-py. The test seam: tests replace this to inject a scripted fake."""
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    # Older nvidia-ml-py releases return bytes for strings.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvmlGateway:
    """Lazy, thread-safe access to NVML that never lets an NVML error escape raw."""

    def __init__(
        self,
        load: Callable[[], ModuleType] | None = None,
        retry_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._retry_interval_s = retry_interval_s
        self._clock = clock
        self._lock = threading.RLock()
        self._nvml: ModuleType | None = None
        self._initialised = False
        self._failure: NvmlUnavailable | None = None
        self._failed_at = 0.0
        self._needs_reinit = False
        # Bumped on every successful init. A failure seen with handles from an older session
        # must not tear down the newer one another thread just built (no re-init ping-pong
        # between the sampler and the Xid monitor).
        self._generation = 0
        self._atexit_registered = False
        # Versioned calls the driver lacked; remembered so they are not retried every tick.
        self._missing: set[str] = set()

    # -- session -------------------------------------------------------------------------
    def ensure(self) -> ModuleType:
        """The initialised module, or NvmlUnavailable with the reason.

        A failure is remembered for `retry_interval_s` so a sampler at 2 Hz does not hammer
        a missing library; after that, init is tried again (a driver may have been loaded).
        """
        with self._lock:
            if self._needs_reinit:
                self._shutdown_locked()
            if self._initialised and self._nvml is not None:
                return self._nvml
            if self._failure is not None and (
                self._clock() - self._failed_at < self._retry_interval_s
            ):
                raise self._failure
            try:
                nvml = self._nvml or (self._load or _load_pynvml)()
            except ImportError as exc:
                raise self._fail(
                    NvmlUnavailable("not_installed", f"nvidia-ml-py not importable: {exc}")
                ) from None
            self._nvml = nvml
            try:
                nvml.nvmlInit()
            except Exception as exc:
                raise self._fail(self.translate(exc)) from None
            self._initialised = True
            self._generation += 1
            self._failure = None
            if not self._atexit_registered:
                atexit.register(self.shutdown)
                self._atexit_registered = True
            return nvml

    def _fail(self, err: NvmlUnavailable) -> NvmlUnavailable:
        self._failure = err
        self._failed_at = self._clock()
        return err

    def shutdown(self) -> None:
        """nvmlShutdown if initialised; safe to call twice and at exit."""
        with self._lock:
            self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        self._needs_reinit = False
        if self._initialised and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # a lost GPU may refuse a clean shutdown
                log.debug("nvmlShutdown failed: %s", exc)
        self._initialised = False
        self._failure = None
        self._missing.clear()

    def request_reinit(self, generation: int | None = None) -> None:
        """Re-create the NVML session on the next call (after a lost GPU or driver reload).

        With `generation`, only if the session that failed is still the current one.
        """
        with self._lock:
            if generation is None or generation == self._generation:
                self._needs_reinit = True

    def translate(self, exc: BaseException) -> NvmlUnavailable:
        """Turn any exception from pynvml into NvmlUnavailable with a plain reason."""
        return translate_error(exc)

    # -- calls ---------------------------------------------------------------------------
    def call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call `pynvml.<fn_name>`; NvmlUnavailable on any failure (never a raw NVMLError)."""
        nvml = self.ensure()
        generation = self._generation
        fn = getattr(nvml, fn_name, None)
        if fn is None:
            raise NvmlUnavailable("function_not_found", f"{fn_name} not in this nvidia-ml-py")
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            err = self.translate(exc)
            if err.kind in REINIT_KINDS:
                self.request_reinit(generation)
            raise err from None

    def call_versioned(
        self, variants: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
    ) -> Any:
        """Try each (function, args, kwargs) in order, newest first, falling back when the
        driver lacks it; the variant that failed is remembered and skipped next time."""
        last: NvmlUnavailable | None = None
        for fn_name, args, kwargs in variants:
            key = fn_name + repr(sorted(kwargs))
            if key in self._missing:
                continue
            try:
                return self.call(fn_name, *args, **kwargs)
            except NvmlUnavailable as err:
                last = err
                if err.kind in ("function_not_found", "version_mismatch", "not_supported"):
                    self._missing.add(key)
                    continue
                raise
            except TypeError as exc:  # an old nvidia-ml-py without the keyword
                last = NvmlUnavailable("function_not_found", str(exc))
                self._missing.add(key)
        raise last or NvmlUnavailable("function_not_found", "no variant available")

    def optional(self, fn_name: str, *args: Any) -> Any:
        """A reading that may legitimately be missing: None when not supported."""
        try:
            return self.call(fn_name, *args)
        except NvmlUnavailable as err:
            if err.kind in MISSING_KINDS or err.kind in ("no_permission", "nvml_error"):
                return None
            raise

    # -- readings ------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Any:
        return self.call("nvmlDeviceGetHandleByIndex", index)

    def pci_bus_id(self, handle: Any) -> str:
        nvml = self.ensure()
        variants = []
        if hasattr(nvml, "nvmlDeviceGetPciInfo_v3"):
            variants.append(("nvmlDeviceGetPciInfo_v3", (handle,), {}))
        variants.append(("nvmlDeviceGetPciInfo", (handle,), {}))
        info = self.call_versioned(variants)
        return _text(info.busId)

    def memory(self, handle: Any) -> tuple[int, int, int | None, int]:
        """(total, used, reserved or None, free); `_v2` when the driver has it."""
        nvml = self.ensure()
        variants: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            variants.append(("nvmlDeviceGetMemoryInfo", (handle,), {"version": v2}))
        variants.append(("nvmlDeviceGetMemoryInfo", (handle,), {}))
        info = self.call_versioned(variants)
        reserved = getattr(info, "reserved", None)
        return (
            int(info.total),
            int(info.used),
            (int(reserved) if reserved is not None else None),
            int(info.free),
        )

    def processes(self, handle: Any) -> list[tuple[int, int | None]]:
        nvml = self.ensure()
        names = [
            n
            for n in (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
                "nvmlDeviceGetComputeRunningProcesses",
            )
            if hasattr(nvml, n)
        ]
        procs = self.call_versioned([(n, (handle,), {}) for n in names])
        out: list[tuple[int, int | None]] = []
        for p in procs or ():
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if used is not None else None))
        return out

    def recovery_action(self, handle: Any) -> str | None:
        try:
            values = self.call("nvmlDeviceGetFieldValues", handle, [FIELD_RECOVERY_ACTION])
        except NvmlUnavailable as err:
            if err.kind in REINIT_KINDS:
                raise
            return None
        if not values:
            return None
        v = values[0]
        if getattr(v, "nvmlReturn", 0) != 0:
            return None
        raw = getattr(v.value, "uiVal", v.value)
        try:
            code = int(raw)
        except (TypeError, ValueError):
            return None
        return RECOVERY_ACTIONS.get(code, f"unknown ({code})")

    def versions(self) -> tuple[str | None, str | None]:
        driver = self.optional("nvmlSystemGetDriverVersion")
        cuda: int | None
        try:
            cuda = self.call_versioned(
                [
                    ("nvmlSystemGetCudaDriverVersion_v2", (), {}),
                    ("nvmlSystemGetCudaDriverVersion", (), {}),
                ]
            )
        except NvmlUnavailable:
            cuda = None
        return (
            _text(driver) if driver is not None else None,
            format_cuda_version(int(cuda)) if cuda is not None else None,
        )

    def read_device(self, index: int, own_pids: Collection[int]) -> GpuDevice:
        """One device's reading; a device that fails mid-read comes back with `problem` set."""
        nvml = self.ensure()
        handle = None
        try:
            handle = self.handle(index)
            name = _text(self.call("nvmlDeviceGetName", handle))
            uuid = _text(self.call("nvmlDeviceGetUUID", handle))
            bus_id = self.pci_bus_id(handle)
            total, used, reserved, _free = self.memory(handle)
        except NvmlUnavailable as err:
            return GpuDevice(
                index=index,
                name="?",
                uuid="?",
                pci_bus_id="?",
                memory_total=0,
                memory_used=0,
                memory_reserved=None,
                utilization_pct=None,
                temperature_c=None,
                power_w=None,
                processes=(),
                recovery_action=None,
                problem=err.reason,
            )
        util = self.optional("nvmlDeviceGetUtilizationRates", handle)
        temp = self.optional(
            "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        )
        power_mw = self.optional("nvmlDeviceGetPowerUsage", handle)
        try:
            procs = self.processes(handle)
        except NvmlUnavailable:
            procs = []
        own = set(own_pids)
        return GpuDevice(
            index=index,
            name=name,
            uuid=uuid,
            pci_bus_id=bus_id,
            memory_total=total,
            memory_used=used,
            memory_reserved=reserved,
            utilization_pct=int(util.gpu) if util is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            processes=tuple(GpuProcess(pid, mem, pid in own) for pid, mem in procs),
            recovery_action=self.recovery_action(handle),
        )

    def snapshot(self, own_pids: Collection[int] = ()) -> GpuSnapshot:
        """A full reading; never raises."""
        now = time.time()
        try:
            self.ensure()
            count = self.device_count()
            driver, cuda = self.versions()
            devices = tuple(self.read_device(i, own_pids) for i in range(count))
        except NvmlUnavailable as err:
            return GpuSnapshot(now, False, err.reason, None, None, (), err.kind)
        except Exception as exc:  # a bug or a surprise in pynvml must not kill a sampler
            log.exception("unexpected error reading NVML")
            return GpuSnapshot(now, False, f"unexpected error: {exc}", None, None, (), "error")
        if count == 0:
            return GpuSnapshot(now, False, "no NVIDIA GPU found", driver, cuda, (), "no_gpu")
        return GpuSnapshot(now, True, None, driver, cuda, devices)

    def bus_index_map(self) -> dict[tuple[int, int, int], int]:
        """Normalised bus id → device index, for tying kernel-log Xids to devices."""
        out: dict[tuple[int, int, int], int] = {}
        try:
            for i in range(self.device_count()):
                bus = normalize_bus_id(self.pci_bus_id(self.handle(i)))
                if bus is not None:
                    out[bus] = i
        except NvmlUnavailable:
            pass
        return out


_gateway: NvmlGateway | None = None
_gateway_lock = threading.Lock()


def gateway() -> NvmlGateway:
    """The process-wide gateway, created on first use."""
    global _gateway
    with _gateway_lock:
        if _gateway is None:
            _gateway = NvmlGateway(load=lambda: _load_pynvml())
        return _gateway


def reset_gateway() -> None:
    """Shut down and forget the process-wide gateway (a fresh one is made on next use)."""
    global _gateway
    with _gateway_lock:
        if _gateway is not None:
            _gateway.shutdown()
        _gateway = None


def take_snapshot(own_pids: Collection[int] = ()) -> GpuSnapshot:
    """One reading of every GPU; never raises (`available=False` says why)."""
    return gateway().snapshot(own_pids)


def free_memory_bytes(device_index: int) -> int | None:
    """Free memory on one GPU as NVML sees it; None when unknown (no NVML, bad index, ...)."""
    gw = gateway()
    try:
        _total, _used, _reserved, free = gw.memory(gw.handle(device_index))
    except NvmlUnavailable:
        return None
    except Exception:
        log.exception("unexpected error reading free memory")
        return None
    return free

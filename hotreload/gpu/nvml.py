"""The NVML gateway: the only module that imports `pynvml` (nvidia-ml-py).

Every NVML call goes through `NvmlGateway.call`, which turns NVML errors into
`NvmlUnavailable` carrying a plain reason ("NVML library not found", "GPU lost", ...).
The library is loaded and initialised lazily on first use (so importing this module costs
nothing and never touches the driver) and shut down at interpreter exit.

Readings are frozen dataclasses (`GpuSnapshot`, `GpuDevice`, `GpuProcess`): widgets and the
engine read snapshots and never reach the hardware. `GpuSampler` takes readings on one
long-lived thread at a fixed interval, never overlapping itself.

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

from hotreload.gpu.readings import GpuDevice, GpuProcess, GpuSnapshot, normalize_bus_id

log = logging.getLogger(__name__)

__all__ = [
    "GpuDevice",
    "GpuProcess",
    "GpuSampler",
    "GpuSnapshot",
    "NvmlGateway",
    "NvmlUnavailable",
    "free_memory_bytes",
    "gateway",
    "normalize_bus_id",
    "reset_gateway",
    "take_snapshot",
]

#: NVML field id of the driver's recommended recovery action
#: (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
FIELD_RECOVERY_ACTION = 230
#: Recovery action values as NVML defines them (`NVML_GPU_RECOVERY_ACTION_*`).
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "GPU reset required",
    2: "node reboot required",
    3: "drain P2P",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "bus reset",
    7: "system reboot",
}

# Error class names (as pynvml generates them) → the kind we report and the reason shown.
_ERROR_KINDS: dict[str, tuple[str, str]] = {
    "NVMLError_LibraryNotFound": (
        "library_not_found",
        "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed",
    ),
    "NVMLError_DriverNotLoaded": ("driver_not_loaded", "NVIDIA driver not loaded"),
    "NVMLError_NoPermission": ("no_permission", "no permission to query NVML"),
    "NVMLError_NotSupported": ("not_supported", "not supported on this GPU or driver"),
    "NVMLError_GpuIsLost": ("gpu_lost", "GPU lost (fallen off the bus?)"),
    "NVMLError_LibRmVersionMismatch": (
        "version_mismatch",
        "NVML library and kernel driver versions differ (reboot after a driver upgrade)",
    ),
    "NVMLError_FunctionNotFound": ("function_not_found", "function not in this driver's NVML"),
    "NVMLError_Uninitialized": ("uninitialized", "NVML not initialised"),
    "NVMLError_Timeout": ("timeout", "timed out"),
    "NVMLError_ResetRequired": ("reset_required", "GPU requires a reset"),
    "NVMLError_InsufficientPower": ("insufficient_power", "GPU has insufficient power"),
    "NVMLError_ArgumentVersionMismatch": ("version_mismatch", "struct version not supported"),
    "NVMLError_NotFound": ("not_found", "not found"),
    "NVMLError_InvalidArgument": ("invalid_argument", "invalid argument"),
}

#: Kinds after which the whole NVML session must be re-created (shutdown + init).
REINIT_KINDS = frozenset({"gpu_lost", "uninitialized", "driver_not_loaded", "reset_required"})
#: Kinds that mean "this optional reading is just not there".
_MISSING_KINDS = frozenset(
    {"not_supported", "function_not_found", "version_mismatch", "not_found", "invalid_argument"}
)


class NvmlUnavailable(Exception):
    """An NVML call failed; `kind` is machine-readable, `reason` is for people."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _load_pynvml() -> ModuleType:
    """Import nvidia-ml-py. The test seam: tests replace this to inject a scripted fake."""
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    # Older nvidia-ml-py releases return bytes for strings.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _format_cuda_version(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


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

    @property
    def module(self) -> ModuleType | None:
        return self._nvml

    def translate(self, exc: BaseException) -> NvmlUnavailable:
        """Turn any exception from pynvml into NvmlUnavailable with a plain reason."""
        if isinstance(exc, NvmlUnavailable):
            return exc
        name = type(exc).__name__
        for klass in type(exc).__mro__:
            if klass.__name__ in _ERROR_KINDS:
                name = klass.__name__
                break
        if name in _ERROR_KINDS:
            kind, reason = _ERROR_KINDS[name]
            return NvmlUnavailable(kind, reason)
        if name.startswith("NVMLError"):
            return NvmlUnavailable("nvml_error", f"NVML error: {exc}")
        return NvmlUnavailable("error", f"{name}: {exc}")

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
            if err.kind in _MISSING_KINDS or err.kind in ("no_permission", "nvml_error"):
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
            _format_cuda_version(int(cuda)) if cuda is not None else None,
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


class GpuSampler:
    """Takes a reading every `interval_s` on one thread and hands it to `on_snapshot`.

    Readings never overlap: the next one is scheduled from the start of the previous one and
    skipped ahead if a reading overran. Without NVML it publishes one snapshot saying why,
    then only re-checks every `retry_interval_s`, publishing again only if that changes.
    """

    def __init__(
        self,
        on_snapshot: Callable[[GpuSnapshot], None],
        interval_s: float = 0.5,
        own_pids: Callable[[], Collection[int]] = tuple,
        *,
        retry_interval_s: float = 10.0,
        nvml: NvmlGateway | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._on_snapshot = on_snapshot
        self._interval_s = interval_s
        self._own_pids = own_pids
        self._retry_interval_s = retry_interval_s
        self._gateway = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: GpuSnapshot | None = None
        self.readings = 0

    @property
    def latest(self) -> GpuSnapshot | None:
        """The most recent snapshot published, or None before the first."""
        return self._latest

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._thread = threading.Thread(target=self._run, name="hotreload-gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 2.0) -> bool:
        """Stop and join; True when the thread ended within `timeout`."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _read(self) -> GpuSnapshot:
        gw = self._gateway or gateway()
        try:
            own = self._own_pids()
        except Exception:
            log.exception("own_pids callback failed")
            own = ()
        return gw.snapshot(own)

    def _publish(self, snap: GpuSnapshot) -> None:
        self._latest = snap
        try:
            self._on_snapshot(snap)
        except Exception:  # a consumer's bug must not stop the telemetry
            log.exception("on_snapshot callback failed")

    def _run(self) -> None:
        published_reason: tuple[bool, str | None] | None = None
        next_at = time.monotonic()
        while not self._stop.is_set():
            snap = self._read()
            self.readings += 1
            key = (snap.available, snap.reason_kind)
            if snap.available or key != published_reason:
                self._publish(snap)
                published_reason = key
            period = self._interval_s if snap.available else self._retry_interval_s
            next_at += period
            now = time.monotonic()
            if next_at < now:  # a reading overran: skip the missed ticks rather than burst
                next_at = now + period if not snap.available else now
            self._stop.wait(max(next_at - now, 0.0))

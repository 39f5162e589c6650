"""NVML's errors in plain words: `NvmlUnavailable` and the tables the gateway reads.

pynvml raises one generated class per NVML return code (`NVMLError_GpuIsLost`, ...);
`translate_error` maps each to a machine-readable kind and a reason a person can act on.
"""

from __future__ import annotations


class NvmlUnavailable(Exception):
    """An NVML call failed; `kind` is machine-readable, `reason` is for people."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


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
ERROR_KINDS: dict[str, tuple[str, str]] = {
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
MISSING_KINDS = frozenset(
    {"not_supported", "function_not_found", "version_mismatch", "not_found", "invalid_argument"}
)


def translate_error(exc: BaseException) -> NvmlUnavailable:
    """Turn any exception from pynvml into NvmlUnavailable with a plain reason."""
    if isinstance(exc, NvmlUnavailable):
        return exc
    name = type(exc).__name__
    for klass in type(exc).__mro__:
        if klass.__name__ in ERROR_KINDS:
            name = klass.__name__
            break
    if name in ERROR_KINDS:
        kind, reason = ERROR_KINDS[name]
        return NvmlUnavailable(kind, reason)
    if name.startswith("NVMLError"):
        return NvmlUnavailable("nvml_error", f"NVML error: {exc}")
    return NvmlUnavailable("error", f"{name}: {exc}")

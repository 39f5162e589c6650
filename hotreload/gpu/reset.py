"""GPU reset for local development: `nvidia-smi --gpu-reset -i N`, only when it is safe.

Off unless the config (`reset = "on-wedge" | "ask"`) or a flag allows it. Every
precondition is checked and a refusal names the reason and the blocking PIDs. After an
Xid 79 the GPU is off the bus and no reset can bring it back: the machine needs a power
cycle, and that is what we say instead of trying.

The probes (euid, `which`, `sudo -n true`, the NVML process list, the command runner) sit
in a `ResetProbes` object so tests can script every refusal without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from hotreload.config import RESET_MODES  # never; reset on a wedge when allowed; ask first
from hotreload.gpu.nvml import NvmlUnavailable, gateway
from hotreload.gpu.xid_events import XidEvent

__all__ = [
    "POWER_CYCLE_XIDS",
    "RESET_MODES",
    "CommandResult",
    "ResetDecision",
    "ResetProbes",
    "ResetResult",
    "check_reset",
    "reset_gpu",
    "reset_on_wedge",
]

#: Kernel-log codes after which a reset is pointless or unsafe.
POWER_CYCLE_XIDS = frozenset({79})


@dataclass(frozen=True)
class ResetDecision:
    """Whether `reset_gpu` may run now, and if not, why."""

    allowed: bool
    reason: str
    #: PIDs that keep the GPU busy (other processes, or hotreload workers still running).
    blocking_pids: tuple[int, ...] = ()
    #: The command that would run, when allowed.
    command: tuple[str, ...] = ()

    def refusal(self) -> ResetResult:
        """This refusal as the failed ResetResult a caller reports (reason and PIDs)."""
        pids = ""
        if self.blocking_pids:
            pids = " (blocking PIDs: " + ", ".join(map(str, self.blocking_pids)) + ")"
        return ResetResult(False, f"GPU reset refused: {self.reason}{pids}")


@dataclass(frozen=True)
class ResetResult:
    """What a reset did (or why it was not tried), in a line for the user."""

    ok: bool
    message: str


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str


def _run(cmd: Sequence[str], timeout_s: float) -> CommandResult:
    try:
        out = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return CommandResult(124, f"timed out after {timeout_s:g} s")
    except OSError as exc:
        return CommandResult(127, str(exc))
    return CommandResult(out.returncode, (out.stdout + out.stderr).strip())


def _nvml_pids(device_index: int) -> tuple[int, ...]:
    """PIDs with a compute context on the device; NvmlUnavailable when NVML cannot say."""
    gw = gateway()
    handle = gw.handle(device_index)
    pids = {pid for pid, _ in gw.processes(handle)}
    # Graphics clients (a desktop session) also block a reset.
    try:
        for p in gw.call("nvmlDeviceGetGraphicsRunningProcesses", handle) or ():
            pids.add(int(p.pid))
    except NvmlUnavailable as err:
        if err.kind in ("gpu_lost", "driver_not_loaded", "uninitialized"):
            raise
    return tuple(sorted(pids))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ResetProbes:
    """How `check_reset` and `reset_gpu` look at the machine; replace any for tests."""

    euid: Callable[[], int] = os.geteuid
    which: Callable[[str], str | None] = shutil.which
    run: Callable[[Sequence[str], float], CommandResult] = _run
    #: PIDs on the device per NVML; raises NvmlUnavailable when NVML cannot tell.
    device_pids: Callable[[int], tuple[int, ...]] = _nvml_pids
    pid_alive: Callable[[int], bool] = _pid_alive
    sudo_timeout_s: float = 5.0
    _sudo_cache: dict[str, bool] = field(default_factory=dict)

    def sudo_works(self) -> bool:
        if "ok" not in self._sudo_cache:
            if self.which("sudo") is None:
                self._sudo_cache["ok"] = False
            else:
                res = self.run(["sudo", "-n", "true"], self.sudo_timeout_s)
                self._sudo_cache["ok"] = res.returncode == 0
        return self._sudo_cache["ok"]


def _refuse(reason: str, pids: Collection[int] = ()) -> ResetDecision:
    return ResetDecision(False, reason, tuple(sorted(pids)))


def check_reset(
    device_index: int,
    own_worker_pids: Collection[int],
    xid_history: Sequence[XidEvent] = (),
    allow: bool = False,
    *,
    probes: ResetProbes | None = None,
) -> ResetDecision:
    """Decide whether GPU `device_index` may be reset now. Never raises.

    `own_worker_pids` are hotreload's workers on that GPU: they must all have exited
    already. Any other process on the device blocks the reset.
    """
    p = probes or ResetProbes()
    try:
        lost = [
            e
            for e in xid_history
            if e.xid in POWER_CYCLE_XIDS and (e.device_index in (None, device_index))
        ]
        if lost:
            where = lost[-1].pci or f"GPU {device_index}"
            return _refuse(
                f"Xid 79 on {where}: the GPU has fallen off the bus; a reset cannot recover "
                "it. The machine needs a power cycle."
            )
        if not allow:
            return _refuse(
                'GPU reset is off: set reset = "on-wedge" or "ask" under [gpu] in the config '
                "to allow it"
            )
        smi = p.which("nvidia-smi")
        if smi is None:
            return _refuse(
                "nvidia-smi not found on PATH; install the NVIDIA driver's utilities "
                "(nvidia-utils) or add their folder to PATH"
            )
        if p.euid() == 0:
            prefix: tuple[str, ...] = ()
        elif p.sudo_works():
            prefix = ("sudo", "-n")
        else:
            return _refuse(
                "a GPU reset needs root: run as root or allow passwordless sudo "
                "for nvidia-smi (`sudo -n true` failed)"
            )
        alive_workers = [pid for pid in own_worker_pids if p.pid_alive(pid)]
        if alive_workers:
            return _refuse(
                "hotreload workers on this GPU are still running; stop them first",
                alive_workers,
            )
        try:
            pids = p.device_pids(device_index)
        except NvmlUnavailable as err:
            return _refuse(
                f"cannot list the processes on GPU {device_index}: {err.reason}; a reset is "
                "only tried when NVML shows the GPU idle (`hotreload doctor` says why not)"
            )
        own = set(own_worker_pids)
        others = [pid for pid in pids if pid not in own]
        if others:
            return _refuse(
                f"other processes are using GPU {device_index}; a reset would kill their "
                "work: stop them first",
                others,
            )
        if pids:  # NVML still lists our (exited) workers: the driver has not let go yet
            return _refuse(
                f"GPU {device_index} still holds contexts of stopped hotreload workers; "
                "wait a few seconds for the driver to release them, then try again",
                pids,
            )
        cmd = (*prefix, smi, "--gpu-reset", "-i", str(device_index))
        return ResetDecision(True, f"GPU {device_index} can be reset", (), cmd)
    except Exception as exc:  # a probe failing must read as a refusal, not a crash
        return _refuse(
            f"could not check the reset preconditions: {exc}; reset by hand with "
            f"`sudo nvidia-smi --gpu-reset -i {device_index}` once the GPU is idle"
        )


def reset_gpu(
    device_index: int,
    own_worker_pids: Collection[int] = (),
    xid_history: Sequence[XidEvent] = (),
    allow: bool = False,
    *,
    timeout_s: float = 60.0,
    probes: ResetProbes | None = None,
) -> ResetResult:
    """Check the preconditions, then run `nvidia-smi --gpu-reset -i N`. Never raises."""
    p = probes or ResetProbes()
    decision = check_reset(device_index, own_worker_pids, xid_history, allow, probes=p)
    if not decision.allowed:
        return decision.refusal()
    return _run_reset(device_index, decision, p, timeout_s)


def _run_reset(
    device_index: int, decision: ResetDecision, p: ResetProbes, timeout_s: float
) -> ResetResult:
    res = p.run(decision.command, timeout_s)
    if res.returncode == 0:
        return ResetResult(True, f"GPU {device_index} reset: {res.output or 'done'}")
    low = res.output.lower()
    if "in use by another client" in low:
        hint = (
            "a persistence daemon or display server may hold it: stop nvidia-persistenced "
            "or the display manager, or reboot"
        )
    elif "not supported" in low:
        hint = "this GPU does not support a reset; reboot instead"
    else:
        hint = "reboot if the GPU stays unusable"
    return ResetResult(
        False, f"nvidia-smi --gpu-reset failed ({res.returncode}): {res.output} ({hint})"
    )


def reset_on_wedge(
    mode: str,
    device_index: int,
    own_worker_pids: Collection[int],
    xid_history: Sequence[XidEvent] = (),
    *,
    allow_flag: bool = False,
    confirm: Callable[[ResetDecision], bool] | None = None,
    probes: ResetProbes | None = None,
    timeout_s: float = 60.0,
) -> ResetResult | None:
    """The engine's wedge-escalation hook; runs after the wedged worker was killed.

    mode "never": None (nothing tried, unless `allow_flag` forces "on-wedge").
    mode "on-wedge": reset when every precondition holds, else the refusal (nothing run).
    mode "ask": check first, then reset only if `confirm(decision)` says yes; the
    preconditions are checked again after the answer, since the machine may have changed
    while the user read the question.
    """
    if mode not in RESET_MODES:
        return ResetResult(
            False,
            f"unknown reset mode {mode!r}; set [gpu] reset to one of "
            + ", ".join(f'"{m}"' for m in RESET_MODES),
        )
    if mode == "never" and not allow_flag:
        return None
    p = probes or ResetProbes()
    decision = check_reset(device_index, own_worker_pids, xid_history, True, probes=p)
    if not decision.allowed:
        return decision.refusal()
    if mode == "ask":
        if not (confirm and confirm(decision)):
            return ResetResult(False, "GPU reset not confirmed; nothing was run")
        return reset_gpu(
            device_index, own_worker_pids, xid_history, True, timeout_s=timeout_s, probes=p
        )
    return _run_reset(device_index, decision, p, timeout_s)

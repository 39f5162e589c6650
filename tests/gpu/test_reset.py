"""GPU reset: every refusal scripted through the probes, plus the real no-GPU path."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hotreload.gpu.nvml import NvmlUnavailable
from hotreload.gpu.reset import (
    CommandResult,
    ResetProbes,
    check_reset,
    reset_gpu,
    reset_on_wedge,
)
from hotreload.gpu.xid import parse_line

WORKER = 4001


class Machine:
    """A scripted machine: who we are, what is installed, what runs on the GPU."""

    def __init__(self) -> None:
        self.euid = 0
        self.tools = {"nvidia-smi": "/usr/bin/nvidia-smi", "sudo": "/usr/bin/sudo"}
        self.sudo_ok = False
        self.alive: set[int] = set()
        self.gpu_pids: tuple[int, ...] = ()
        self.nvml_error: str | None = None
        self.reset_result = CommandResult(0, "GPU 00000000:01:00.0 was successfully reset.")
        self.ran: list[tuple[str, ...]] = []

    def run(self, cmd: Sequence[str], timeout_s: float) -> CommandResult:
        self.ran.append(tuple(cmd))
        if tuple(cmd) == ("sudo", "-n", "true"):
            return CommandResult(0 if self.sudo_ok else 1, "" if self.sudo_ok else "a password")
        return self.reset_result

    def device_pids(self, index: int) -> tuple[int, ...]:
        if self.nvml_error:
            raise NvmlUnavailable("library_not_found", self.nvml_error)
        return self.gpu_pids

    def probes(self) -> ResetProbes:
        return ResetProbes(
            euid=lambda: self.euid,
            which=self.tools.get,
            run=self.run,
            device_pids=self.device_pids,
            pid_alive=lambda pid: pid in self.alive,
        )


@pytest.fixture
def machine() -> Machine:
    return Machine()


def decide(machine: Machine, allow: bool = True, history: Sequence[object] = ()):  # type: ignore[no-untyped-def]
    return check_reset(0, {WORKER}, history, allow, probes=machine.probes())  # type: ignore[arg-type]


def test_allowed_as_root_with_an_idle_gpu(machine: Machine) -> None:
    d = decide(machine)
    assert d.allowed and d.command == ("/usr/bin/nvidia-smi", "--gpu-reset", "-i", "0")


def test_allowed_through_passwordless_sudo(machine: Machine) -> None:
    machine.euid, machine.sudo_ok = 1000, True
    d = decide(machine)
    assert d.allowed and d.command[:2] == ("sudo", "-n")


def test_refused_when_not_allowed(machine: Machine) -> None:
    d = decide(machine, allow=False)
    assert not d.allowed and "reset is off" in d.reason


def test_refused_after_xid_79_needs_power_cycle(machine: Machine) -> None:
    ev = parse_line("NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.")
    for allow in (True, False):
        d = decide(machine, allow=allow, history=[ev])
        assert not d.allowed and "power cycle" in d.reason
    assert machine.ran == []  # never even tried


def test_xid_79_on_another_gpu_does_not_block(machine: Machine) -> None:
    ev = parse_line("NVRM: Xid (PCI:0000:65:00): 79, GPU has fallen off the bus.")
    from dataclasses import replace

    assert decide(machine, history=[replace(ev, device_index=1)]).allowed


def test_refused_without_nvidia_smi(machine: Machine) -> None:
    del machine.tools["nvidia-smi"]
    d = decide(machine)
    assert not d.allowed and "nvidia-smi not found" in d.reason


def test_refused_without_root_or_sudo(machine: Machine) -> None:
    machine.euid = 1000
    d = decide(machine)
    assert not d.allowed and "root" in d.reason and "sudo -n true" in d.reason
    del machine.tools["sudo"]
    assert not decide(machine).allowed


def test_refused_while_our_workers_still_run(machine: Machine) -> None:
    machine.alive = {WORKER}
    d = decide(machine)
    assert not d.allowed and "still running" in d.reason and d.blocking_pids == (WORKER,)


def test_refused_when_other_processes_use_the_gpu(machine: Machine) -> None:
    machine.gpu_pids = (WORKER, 777, 555)
    d = decide(machine)
    assert not d.allowed and "other processes" in d.reason
    assert d.blocking_pids == (555, 777)  # our stopped worker is not the blocker


def test_refused_while_the_driver_holds_our_stopped_workers(machine: Machine) -> None:
    machine.gpu_pids = (WORKER,)
    d = decide(machine)
    assert not d.allowed and d.blocking_pids == (WORKER,)


def test_refused_without_nvml(machine: Machine) -> None:
    machine.nvml_error = "NVML library not found"
    d = decide(machine)
    assert not d.allowed and "NVML library not found" in d.reason


def test_a_crashing_probe_is_a_refusal(machine: Machine) -> None:
    probes = machine.probes()

    def broken() -> int:
        raise OSError("no euid today")

    probes.euid = broken
    d = check_reset(0, (), (), True, probes=probes)
    assert not d.allowed and "no euid today" in d.reason


def test_reset_runs_nvidia_smi(machine: Machine) -> None:
    r = reset_gpu(0, {WORKER}, allow=True, probes=machine.probes())
    assert r.ok and "successfully reset" in r.message
    assert machine.ran[-1] == ("/usr/bin/nvidia-smi", "--gpu-reset", "-i", "0")


def test_reset_failure_is_explained(machine: Machine) -> None:
    machine.reset_result = CommandResult(255, "GPU 00000000:01:00.0 is in use by another client")
    r = reset_gpu(0, {WORKER}, allow=True, probes=machine.probes())
    assert not r.ok and "persistence daemon" in r.message and "nvidia-persistenced" in r.message
    machine.reset_result = CommandResult(3, "Unknown Error")
    r = reset_gpu(0, {WORKER}, allow=True, probes=machine.probes())
    assert r.message == (
        "nvidia-smi --gpu-reset failed (3): Unknown Error (reboot if the GPU stays unusable)"
    )


def test_reset_refusal_names_the_blocking_pids(machine: Machine) -> None:
    machine.gpu_pids = (777,)
    r = reset_gpu(0, {WORKER}, allow=True, probes=machine.probes())
    assert not r.ok and "777" in r.message and machine.ran == []


def test_wedge_escalation_follows_the_mode(machine: Machine) -> None:
    p = machine.probes()
    assert reset_on_wedge("never", 0, {WORKER}, probes=p) is None
    assert machine.ran == []
    r = reset_on_wedge("ask", 0, {WORKER}, confirm=lambda d: False, probes=p)
    assert r is not None and not r.ok and "not confirmed" in r.message
    asked = []
    r = reset_on_wedge("ask", 0, {WORKER}, confirm=lambda d: asked.append(d) or True, probes=p)
    assert r is not None and r.ok and asked and asked[0].allowed
    r = reset_on_wedge("on-wedge", 0, {WORKER}, probes=p)
    assert r is not None and r.ok
    machine.gpu_pids = (777,)
    r = reset_on_wedge("on-wedge", 0, {WORKER}, probes=p)
    assert r is not None and not r.ok and "777" in r.message
    r = reset_on_wedge("sometimes", 0, {WORKER}, probes=p)
    assert r is not None and not r.ok and "unknown reset mode 'sometimes'" in r.message
    assert '"on-wedge"' in r.message


@pytest.mark.parametrize("mode", ["on-wedge", "ask"])
def test_wedge_escalation_reports_a_refusal_without_trying(machine: Machine, mode: str) -> None:
    # Another process holds the GPU at the check, and lets go right after it: the refusal
    # stands, and nvidia-smi is never run on the strength of a second look.
    checks = [(777,), ()]
    machine.device_pids = lambda index: checks.pop(0) if checks else ()  # type: ignore[method-assign]
    asked: list[object] = []
    r = reset_on_wedge(
        mode, 0, {WORKER}, confirm=lambda d: asked.append(d) or True, probes=machine.probes()
    )
    assert r is not None and not r.ok
    assert r.message.startswith("GPU reset refused: other processes are using GPU 0")
    assert "stop them first" in r.message and "(blocking PIDs: 777)" in r.message
    assert not [cmd for cmd in machine.ran if "--gpu-reset" in cmd]
    assert asked == []  # nothing to confirm: the user is not asked about a refused reset


def test_wedge_escalation_after_xid_79_says_power_cycle(machine: Machine) -> None:
    ev = parse_line("NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.")
    r = reset_on_wedge("on-wedge", 0, {WORKER}, [ev], probes=machine.probes())
    assert r is not None and not r.ok and "power cycle" in r.message
    assert machine.ran == []


def test_refusals_say_what_to_do(machine: Machine) -> None:
    assert "under [gpu] in the config" in decide(machine, allow=False).reason
    machine.gpu_pids = (WORKER,)
    assert "wait a few seconds" in decide(machine).reason
    machine.nvml_error = "NVML library not found"
    assert "hotreload doctor" in decide(machine).reason
    del machine.tools["nvidia-smi"]
    assert "add their folder to PATH" in decide(machine).reason


def test_real_probes_on_this_machine_never_raise() -> None:
    d = check_reset(0, (), (), allow=True)
    assert isinstance(d.allowed, bool) and d.reason

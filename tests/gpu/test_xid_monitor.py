"""The Xid monitor: NVML events through the fake, the kernel log through a FIFO."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hotreload.gpu.kernel_log import probe_kernel_log
from hotreload.gpu.xid import XidEvent, XidMonitor
from tests.support import wait_until

if TYPE_CHECKING:
    from conftest import FakeNvml

XID, DBE, RECOVERY = 0x0008, 0x0002, 0x8000


class Collector:
    def __init__(self) -> None:
        self.events: list[XidEvent] = []
        self.lock = threading.Lock()

    def __call__(self, ev: XidEvent) -> None:
        with self.lock:
            self.events.append(ev)


@pytest.fixture
def monitors() -> Iterator[list[XidMonitor]]:
    """Monitors started by a test; stopped and joined (with a timeout) even on failure."""
    box: list[XidMonitor] = []
    yield box
    for m in box:
        assert m.stop(timeout=3), "monitor threads did not stop"


@pytest.fixture
def kmsg_fifo(tmp_path: Path) -> Iterator[tuple[str, Callable[[str], None]]]:
    """A FIFO standing in for /dev/kmsg, and a function writing kmsg records into it."""
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    holder: dict[str, int] = {}
    seq = [0]

    def write(message: str) -> None:
        pause = threading.Event()
        for _ in range(400):  # the monitor thread opens its end shortly after start()
            if "fd" in holder:
                break
            try:
                holder["fd"] = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                pause.wait(0.005)
        seq[0] += 1
        os.write(holder["fd"], f"4,{seq[0]},{seq[0] * 1000000},-;{message}\n".encode())

    yield str(path), write
    if "fd" in holder:
        os.close(holder["fd"])


def make(
    monitors: list[XidMonitor], on_event: Callable[[XidEvent], None], **kw: object
) -> XidMonitor:
    defaults: dict[str, object] = {
        "wait_timeout_ms": 10,
        "merge_window_s": 0.3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    defaults.update(kw)
    m = XidMonitor(on_event, **defaults)  # type: ignore[arg-type]
    monitors.append(m)
    return m


def test_nvml_events_become_xid_events_with_device_and_phase(
    fake_nvml: FakeNvml, monitors: list[XidMonitor]
) -> None:
    fake_nvml.devices.append(fake_nvml.Device(bus_id="00000000:65:00.0"))
    got = Collector()
    m = make(monitors, got, phase_of=lambda: "sync", use_kernel_log=False, merge_window_s=0.01)
    m.start()
    assert m.wait_ready()
    nv = m.sources[0]
    assert (nv.name, nv.active) == ("nvml", True) and "GPU 0, 1" in (nv.reason or "")
    assert m.sources[1].active is False and m.sources[1].reason == "disabled"
    # Registered the Xid, ECC and recovery-action events each device supports.
    assert fake_nvml.registered[0] == XID | DBE | RECOVERY
    fake_nvml.push_event(1, XID, 79)
    fake_nvml.push_event(0, DBE, 0)
    fake_nvml.push_event(0, RECOVERY, 2)
    assert wait_until(lambda: len(got.events) == 3)
    a, b, c = got.events
    assert (a.xid, a.device_index, a.pci, a.bus, a.source, a.phase) == (
        79,
        1,
        "0000:65:00",
        (0, 0x65, 0),
        "nvml",
        "sync",
    )
    assert a.severity == "hardware" and "power-cycle" in a.action.lower()
    assert (b.xid, b.device_index) == (48, 0)
    assert c.xid == 154 and "node reboot" in c.action.lower()
    assert m.events == (a, b, c)


def test_nvml_event_set_is_recreated_after_a_lost_gpu(
    fake_nvml: FakeNvml, monitors: list[XidMonitor]
) -> None:
    got = Collector()
    m = make(monitors, got, use_kernel_log=False, merge_window_s=0.01)
    m.start()
    assert m.wait_ready()
    fake_nvml.push_event(0, XID, 13)
    assert wait_until(lambda: len(got.events) == 1)
    fake_nvml.push_error("GpuIsLost")  # the driver dropped the GPU mid-run
    assert wait_until(lambda: m.event_set_creations >= 2)
    assert fake_nvml.shutdown_count >= 1  # NVML session re-created, not just the set
    assert wait_until(lambda: m.sources[0].active)
    fake_nvml.push_event(0, XID, 31)
    assert wait_until(lambda: [e.xid for e in got.events] == [13, 31])


def test_nvml_source_retries_with_backoff_while_the_driver_is_away(
    fake_nvml: FakeNvml, monitors: list[XidMonitor]
) -> None:
    fake_nvml.init_error = "DriverNotLoaded"
    m = make(monitors, Collector(), use_kernel_log=False)
    m.start()
    assert m.wait_ready()
    assert not m.sources[0].active and "driver not loaded" in (m.sources[0].reason or "")
    fake_nvml.init_error = None  # driver reloaded
    assert wait_until(lambda: m.sources[0].active)


def test_nvml_source_without_the_library_is_inactive_with_the_reason(
    fake_nvml: FakeNvml, monitors: list[XidMonitor]
) -> None:
    fake_nvml.init_error = "LibraryNotFound"
    m = make(monitors, Collector(), use_kernel_log=False)
    m.start()
    assert m.wait_ready()
    s = m.sources[0]
    assert not s.active and "library not found" in (s.reason or "").lower()


def test_devices_without_event_support(fake_nvml: FakeNvml, monitors: list[XidMonitor]) -> None:
    fake_nvml.devices[0].supported_events = 0
    m = make(monitors, Collector(), use_kernel_log=False)
    m.start()
    assert m.wait_ready()
    assert not m.sources[0].active and "no GPU supports" in (m.sources[0].reason or "")


def test_kernel_log_events_get_device_index_and_phase(
    fake_nvml: FakeNvml,
    monitors: list[XidMonitor],
    kmsg_fifo: tuple[str, Callable[[str], None]],
) -> None:
    path, write = kmsg_fifo
    phase = ["load"]
    got = Collector()
    m = make(
        monitors,
        got,
        phase_of=lambda: phase[0],
        use_nvml=False,
        kernel_log_method="kmsg",
        kmsg_path=path,
    )
    m.start()
    assert m.wait_ready()
    assert m.sources[1].active and path in (m.sources[1].reason or "")
    write("nvidia-modeset: some unrelated message")
    write("NVRM: Xid (PCI:0000:01:00): 31, pid=77, name=python, Ch 00000010")
    assert wait_until(lambda: len(got.events) == 1)
    phase[0] = "swap"
    write("NVRM: Xid (PCI:0000:42:00): 13, pid=78, name=python, Graphics Exception")
    assert wait_until(lambda: len(got.events) == 2)
    a, b = got.events
    assert (a.xid, a.pid, a.device_index, a.phase, a.source) == (31, 77, 0, "load", "kmsg")
    assert a.timestamp == "2.000000"  # uptime of the second kmsg record
    assert (b.xid, b.device_index, b.phase) == (13, None, "swap")  # bus NVML does not know


def test_both_sources_report_one_event_once(
    fake_nvml: FakeNvml,
    monitors: list[XidMonitor],
    kmsg_fifo: tuple[str, Callable[[str], None]],
) -> None:
    path, write = kmsg_fifo
    got = Collector()
    m = make(monitors, got, kernel_log_method="kmsg", kmsg_path=path, merge_window_s=2.0)
    m.start()
    assert m.wait_ready() and all(s.active for s in m.sources)
    # NVML first, then the kernel line: one event, the richer kernel one, marked as merged.
    fake_nvml.push_event(0, XID, 43)
    assert wait_until(lambda: m._merger._pending)  # held back, waiting for its twin
    write("NVRM: Xid (PCI:0000:01:00): 43, pid=5, name=python, Ch 1")
    assert wait_until(lambda: len(got.events) == 1)
    # Kernel line first, then NVML: the NVML report is dropped.
    write("NVRM: Xid (PCI:0000:01:00): 31, pid=6, name=python, Ch 2")
    assert wait_until(lambda: len(got.events) == 2)
    fake_nvml.push_event(0, XID, 31)
    assert wait_until(lambda: fake_nvml.events.empty())
    threading.Event().wait(0.1)
    assert m.stop(timeout=3)
    first, second = got.events
    assert (first.xid, first.source, first.pid, first.also_from) == (43, "kmsg", 5, ("nvml",))
    assert (second.xid, second.source, second.also_from) == (31, "kmsg", ())
    assert len(got.events) == 2


def test_unmatched_nvml_event_is_delivered_after_the_window(
    fake_nvml: FakeNvml,
    monitors: list[XidMonitor],
    kmsg_fifo: tuple[str, Callable[[str], None]],
) -> None:
    path, _write = kmsg_fifo
    got = Collector()
    m = make(monitors, got, kernel_log_method="kmsg", kmsg_path=path, merge_window_s=0.05)
    m.start()
    assert m.wait_ready()
    fake_nvml.push_event(0, XID, 94)
    assert wait_until(lambda: len(got.events) == 1)
    assert got.events[0].source == "nvml"


def test_the_drivers_xid_79_and_its_fallen_off_line_are_one_event(
    fake_nvml: FakeNvml,
    monitors: list[XidMonitor],
    kmsg_fifo: tuple[str, Callable[[str], None]],
) -> None:
    path, write = kmsg_fifo
    got = Collector()
    m = make(monitors, got, use_nvml=False, kernel_log_method="kmsg", kmsg_path=path)
    m.start()
    assert m.wait_ready()
    write("NVRM: Xid (PCI:0000:01:00): 79, pid=1173, GPU has fallen off the bus.")
    write("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")
    write("NVRM: Xid (PCI:0000:01:00): 8, marker")
    assert wait_until(lambda: len(got.events) == 2)
    assert [e.xid for e in got.events] == [79, 8]


def test_a_multi_line_kmsg_record_is_one_event_on_its_gpu(
    fake_nvml: FakeNvml,
    monitors: list[XidMonitor],
    kmsg_fifo: tuple[str, Callable[[str], None]],
) -> None:
    path, write = kmsg_fifo
    got = Collector()
    m = make(monitors, got, use_nvml=False, kernel_log_method="kmsg", kmsg_path=path)
    m.start()
    assert m.wait_ready()
    # /dev/kmsg escapes the newlines of the driver's three-line report as \x0a.
    write(
        "NVRM: The NVIDIA GPU 0000:01:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    assert wait_until(lambda: len(got.events) == 1)
    (ev,) = got.events
    assert (ev.xid, ev.inferred, ev.device_index, ev.timestamp) == (79, True, 0, "1.000000")


def test_callbacks_that_raise_do_not_kill_the_monitor(
    fake_nvml: FakeNvml, monitors: list[XidMonitor]
) -> None:
    seen: list[int] = []

    def on_event(ev: XidEvent) -> None:
        seen.append(ev.xid)
        raise RuntimeError("consumer bug")

    def phase_of() -> str | None:
        raise RuntimeError("engine bug")

    m = make(monitors, on_event, phase_of=phase_of, use_kernel_log=False, merge_window_s=0.01)
    m.start()
    assert m.wait_ready()
    fake_nvml.push_event(0, XID, 13)
    fake_nvml.push_event(0, XID, 31)
    assert wait_until(lambda: seen == [13, 31])
    assert m.events[0].phase is None


def test_kernel_log_on_this_machine(monitors: list[XidMonitor]) -> None:
    """The real probe: active with the method it found, or inactive saying why."""
    choice = probe_kernel_log()
    m = make(monitors, Collector(), use_nvml=False)
    m.start()
    assert m.wait_ready(timeout=10)
    s = m.sources[1]
    assert s.active == (choice.method is not None)
    assert s.reason


def test_nothing_enabled(monitors: list[XidMonitor]) -> None:
    m = make(monitors, Collector(), use_nvml=False, use_kernel_log=False)
    m.start()
    assert m.wait_ready(timeout=0.1)
    assert [s.active for s in m.sources] == [False, False]

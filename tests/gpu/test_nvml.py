"""The NVML gateway and sampler: for real without NVML, and through the scripted fake."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from hotreload.gpu import nvml
from hotreload.gpu.nvml import GpuSnapshot, NvmlGateway
from hotreload.gpu.sampler import GpuSampler
from tests.support import wait_until

if TYPE_CHECKING:
    from conftest import FakeNvml

NO_NVML_LIBRARY = ctypes.util.find_library("nvidia-ml") is None


def test_importing_the_gpu_layer_loads_no_pynvml_torch_or_textual() -> None:
    code = (
        "import sys, hotreload.gpu, hotreload.gpu.xid, hotreload.gpu.nvml, hotreload.gpu.reset, "
        "hotreload.gpu.doctor, hotreload.commands.gpu_tools\n"
        "bad = [m for m in ('pynvml', 'torch', 'textual', 'cuda') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# -- the real no-GPU path (this machine has no NVML library) -----------------------------


@pytest.mark.skipif(not NO_NVML_LIBRARY, reason="an NVML library is installed here")
def test_without_nvml_the_snapshot_says_why(no_nvml_gateway: None) -> None:
    snap = nvml.take_snapshot()
    assert not snap.available
    assert snap.devices == ()
    assert snap.reason_kind == "library_not_found"
    assert "NVML library not found" in (snap.reason or "")
    assert nvml.free_memory_bytes(0) is None


@pytest.mark.skipif(not NO_NVML_LIBRARY, reason="an NVML library is installed here")
def test_without_nvml_the_sampler_publishes_once(no_nvml_gateway: None) -> None:
    got: list[GpuSnapshot] = []
    sampler = GpuSampler(got.append, interval_s=0.01, retry_interval_s=0.01)
    sampler.start()
    try:
        wait_until(lambda: sampler.readings >= 5)
    finally:
        assert sampler.stop(timeout=10)
    assert sampler.readings >= 5  # it kept checking ...
    assert len(got) == 1  # ... but said it only once
    assert not got[0].available and "NVML library not found" in (got[0].reason or "")
    assert sampler.latest is got[0]


# -- through the fake --------------------------------------------------------------------


def test_snapshot_reads_every_field(fake_nvml: FakeNvml) -> None:
    FakeDevice = fake_nvml.Device
    fake_nvml.devices = [
        FakeDevice(processes=[(os.getpid(), 512 * 2**20), (999_999, None)], recovery_action=1),
        FakeDevice(name="NVIDIA Other", bus_id="00000000:65:00.0", uuid="GPU-2"),
    ]
    snap = nvml.take_snapshot(own_pids={os.getpid()})
    assert snap.available and snap.reason is None
    assert (snap.driver_version, snap.cuda_driver_version) == ("550.54.15", "12.4")
    d0, d1 = snap.devices
    assert (d0.index, d0.name, d0.pci_bus_id, d0.bus) == (
        0,
        "NVIDIA Fake 24GB",
        "00000000:01:00.0",
        (0, 1, 0),
    )
    assert (d0.memory_total, d0.memory_used, d0.memory_reserved) == (
        24 * 2**30,
        2 * 2**30,
        300 * 2**20,
    )
    assert (d0.utilization_pct, d0.temperature_c, d0.power_w) == (37, 55, 123.4)
    assert d0.processes == (
        nvml.GpuProcess(os.getpid(), 512 * 2**20, True),
        nvml.GpuProcess(999_999, None, False),  # memory unknown (as on WSL)
    )
    assert d0.recovery_action == "GPU reset required"
    assert d1.bus == (0, 0x65, 0) and d1.processes == ()


def test_snapshots_are_frozen(fake_nvml: FakeNvml) -> None:
    snap = nvml.take_snapshot()
    with pytest.raises(AttributeError):
        snap.available = False  # type: ignore[misc]


def test_memory_falls_back_to_v1_when_the_driver_lacks_v2(fake_nvml: FakeNvml) -> None:
    fake_nvml.has_memory_v2 = False
    snap = nvml.take_snapshot()
    assert snap.devices[0].memory_reserved is None
    assert snap.devices[0].memory_used == 2 * 2**30
    nvml.take_snapshot()
    # The missing _v2 call is remembered, not retried on every tick.
    assert fake_nvml.calls.count("nvmlDeviceGetMemoryInfo_v2") == 1


def test_cuda_version_falls_back_to_the_unversioned_call(fake_nvml: FakeNvml) -> None:
    fake_nvml.fail["nvmlSystemGetCudaDriverVersion_v2"] = "FunctionNotFound"
    assert nvml.take_snapshot().cuda_driver_version == "12.4"


def test_unsupported_readings_are_none(fake_nvml: FakeNvml) -> None:
    for fn in ("nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"):
        fake_nvml.fail[fn] = "NotSupported"
    fake_nvml.fail["nvmlDeviceGetUtilizationRates"] = "NoPermission"
    fake_nvml.devices[0].recovery_action = None  # field not known to this driver
    d = nvml.take_snapshot().devices[0]
    assert (d.temperature_c, d.power_w, d.utilization_pct, d.recovery_action) == (
        None,
        None,
        None,
        None,
    )
    assert d.memory_total == 24 * 2**30


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        ("LibraryNotFound", "library_not_found", "library not found"),
        ("DriverNotLoaded", "driver_not_loaded", "driver not loaded"),
        ("NoPermission", "no_permission", "no permission"),
        ("NotSupported", "not_supported", "not supported"),
        ("GpuIsLost", "gpu_lost", "GPU lost"),
        ("LibRmVersionMismatch", "version_mismatch", "reboot"),
        ("Unknown", "nvml_error", "NVML error"),
    ],
)
def test_each_init_error_becomes_not_available_with_its_reason(
    fake_nvml: FakeNvml, error: str, kind: str, words: str
) -> None:
    fake_nvml.init_error = error
    snap = nvml.take_snapshot()
    assert not snap.available and snap.reason_kind == kind
    assert words.lower() in (snap.reason or "").lower()
    assert nvml.free_memory_bytes(0) is None


def test_every_error_class_is_translated(fake_nvml: FakeNvml) -> None:
    gw = nvml.gateway()
    for name in fake_nvml.ERROR_NAMES:
        exc = getattr(fake_nvml, f"NVMLError_{name}")()
        err = gw.translate(exc)
        assert err.reason and err.kind != "error", name


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> object:
        raise ImportError("No module named 'pynvml'")

    gw = NvmlGateway(load=missing, retry_interval_s=0)  # type: ignore[arg-type]
    snap = gw.snapshot()
    assert snap.reason_kind == "not_installed" and "nvidia-ml-py" in (snap.reason or "")


def test_no_devices(fake_nvml: FakeNvml) -> None:
    fake_nvml.devices = []
    snap = nvml.take_snapshot()
    assert not snap.available and snap.reason == "no NVIDIA GPU found"


def test_init_is_lazy_and_failure_is_remembered(fake_nvml: FakeNvml) -> None:
    assert fake_nvml.calls == []  # nothing until the first reading
    gw = NvmlGateway(load=lambda: fake_nvml, retry_interval_s=3600)  # type: ignore[arg-type]
    fake_nvml.init_error = "DriverNotLoaded"
    gw.snapshot()
    gw.snapshot()
    assert fake_nvml.calls.count("nvmlInit") == 1
    gw2 = NvmlGateway(load=lambda: fake_nvml, retry_interval_s=0)  # type: ignore[arg-type]
    gw2.snapshot()
    fake_nvml.init_error = None  # the driver got loaded
    assert gw2.snapshot().available


def test_gpu_lost_mid_run_then_recovers(fake_nvml: FakeNvml) -> None:
    fake_nvml.devices.append(fake_nvml.Device(bus_id="00000000:65:00.0"))
    assert nvml.take_snapshot().available
    fake_nvml.devices[1].lost = True
    snap = nvml.take_snapshot()
    assert snap.available  # the other GPU still reads
    assert snap.devices[0].problem is None
    assert snap.devices[1].problem is not None and "GPU lost" in snap.devices[1].problem
    # A lost GPU makes the gateway re-create its NVML session on the next call.
    fake_nvml.devices[1].lost = False
    snap = nvml.take_snapshot()
    assert fake_nvml.shutdown_count == 1 and fake_nvml.init_count == 2
    assert snap.devices[1].problem is None


def test_free_memory(fake_nvml: FakeNvml) -> None:
    assert nvml.free_memory_bytes(0) == 24 * 2**30 - 2 * 2**30 - 300 * 2**20
    assert nvml.free_memory_bytes(7) is None  # no such device


def test_shutdown_only_after_init(fake_nvml: FakeNvml) -> None:
    gw = NvmlGateway(load=lambda: fake_nvml)  # type: ignore[arg-type]
    gw.shutdown()
    assert fake_nvml.shutdown_count == 0
    gw.snapshot()
    gw.shutdown()
    gw.shutdown()
    assert fake_nvml.shutdown_count == 1


# -- the sampler -------------------------------------------------------------------------


@pytest.fixture
def sampler_box() -> Iterator[list[GpuSampler]]:
    """Holds samplers started by a test; stops them (with a timeout) even on failure."""
    box: list[GpuSampler] = []
    yield box
    for s in box:
        assert s.stop(timeout=10)


def test_sampler_publishes_at_its_interval_and_never_overlaps(
    fake_nvml: FakeNvml, sampler_box: list[GpuSampler]
) -> None:
    fake_nvml.read_delay_s = 0.02  # a reading slower than the interval
    got: list[GpuSnapshot] = []
    own = {4242}
    fake_nvml.devices[0].processes = [(4242, 1)]
    sampler = GpuSampler(got.append, interval_s=0.005, own_pids=lambda: own)
    sampler_box.append(sampler)
    sampler.start()
    assert wait_until(lambda: len(got) >= 5)
    assert fake_nvml.max_concurrent_reads == 1
    assert all(s.available for s in got)
    assert got[-1].devices[0].processes[0].is_hotreload_worker
    assert sampler.latest is not None and sampler.latest.available


def test_sampler_survives_a_failing_callback(
    fake_nvml: FakeNvml, sampler_box: list[GpuSampler]
) -> None:
    calls: list[int] = []

    def boom(snap: GpuSnapshot) -> None:
        calls.append(1)
        raise RuntimeError("consumer bug")

    sampler = GpuSampler(boom, interval_s=0.005)
    sampler_box.append(sampler)
    sampler.start()
    assert wait_until(lambda: len(calls) >= 3)


def test_sampler_reports_a_gpu_lost_mid_run(
    fake_nvml: FakeNvml, sampler_box: list[GpuSampler]
) -> None:
    got: list[GpuSnapshot] = []
    sampler = GpuSampler(got.append, interval_s=0.005)
    sampler_box.append(sampler)
    sampler.start()
    assert wait_until(lambda: len(got) >= 1)
    fake_nvml.devices[0].lost = True
    assert wait_until(lambda: got[-1].devices and got[-1].devices[0].problem is not None)


def test_sampler_rejects_a_zero_interval() -> None:
    with pytest.raises(ValueError):
        GpuSampler(lambda s: None, interval_s=0)


def test_a_stale_failure_does_not_tear_down_a_newer_session(fake_nvml: FakeNvml) -> None:
    gw = nvml.gateway()
    gw.snapshot()
    fake_nvml.devices[0].lost = True
    gw.snapshot()  # fails with "GPU lost" in session 1 and schedules a re-init
    fake_nvml.devices[0].lost = False
    gw.snapshot()  # session 2
    assert fake_nvml.init_count == 2
    gw.request_reinit(generation=1)  # another thread reporting its old session's failure
    gw.snapshot()
    assert (fake_nvml.init_count, fake_nvml.shutdown_count) == (2, 1)

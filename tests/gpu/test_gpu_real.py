"""Checks against a real NVIDIA GPU (marked `gpu`; skipped where `nvidia-smi -L` finds none)."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hotreload.gpu import nvml
from hotreload.gpu.reset import check_reset
from hotreload.gpu.xid import XidMonitor
from hotreload.worker.streams import raw_stream_ref, torch_stream_ref, wait_streams_idle

pytestmark = pytest.mark.gpu

MiB = 2**20


@pytest.fixture(scope="module")
def torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.fail("nvidia-smi sees a GPU but this torch build cannot use it")
    torch.cuda.init()
    return torch


@pytest.fixture
def real_gateway() -> Iterator[None]:
    nvml.reset_gateway()
    yield
    nvml.reset_gateway()


def test_nvml_readings_agree_with_torch(torch_cuda: Any, real_gateway: None) -> None:
    torch = torch_cuda
    block = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")  # NVML must see this
    torch.cuda.synchronize()
    free_t, total_t = torch.cuda.mem_get_info(0)
    snap = nvml.take_snapshot(own_pids={os.getpid()})
    assert snap.available, snap.reason
    assert snap.driver_version and snap.cuda_driver_version
    dev = snap.devices[0]
    # cudaMemGetInfo and NVML may differ by the driver's reservation; allow that plus slack.
    slack = (dev.memory_reserved or 0) + 512 * MiB
    assert abs(dev.memory_total - total_t) <= slack
    nvml_free = nvml.free_memory_bytes(0)
    assert nvml_free is not None and abs(nvml_free - free_t) <= slack
    assert dev.memory_used >= 256 * MiB
    assert dev.bus is not None and dev.uuid.startswith("GPU-")
    mine = [p for p in dev.processes if p.pid == os.getpid()]
    if mine:  # not visible in a container with its own PID namespace
        assert mine[0].is_hotreload_worker
    del block


def test_stream_kept_busy_past_the_deadline_is_reported_busy(torch_cuda: Any) -> None:
    torch = torch_cuda
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU cycles on a ~2 GHz clock
    refs = [torch_stream_ref("torch-stream", stream), raw_stream_ref("raw", stream.cuda_stream)]
    out = wait_streams_idle(refs, deadline_s=0.05)
    assert not out.idle and set(out.busy) == {"torch-stream", "raw"}
    stream.synchronize()
    out = wait_streams_idle(refs, deadline_s=1.0)
    assert out.idle and out.busy == ()


def test_reload_returns_allocated_memory_to_baseline(torch_cuda: Any) -> None:
    torch = torch_cuda

    def build() -> Any:
        return torch.nn.Sequential(
            torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)
        ).to("cuda:0")

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated(0)
    model = build()
    x = torch.randn(64, 2048, device="cuda:0")
    model(x).sum().item()
    one_version = torch.cuda.memory_allocated(0) - baseline
    for _ in range(3):  # availability policy: load next, swap, release old
        new = build()
        new(x).sum().item()
        model, old = new, model
        del old
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_allocated(0) - baseline <= one_version + MiB
    del model, new, x
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated(0) <= baseline + MiB


def test_nvml_event_source_goes_active(real_gateway: None) -> None:
    got: list[object] = []
    lock = threading.Lock()

    def on_event(ev: object) -> None:
        with lock:
            got.append(ev)

    monitor = XidMonitor(on_event, use_kernel_log=False, wait_timeout_ms=50)
    monitor.start()
    try:
        assert monitor.wait_ready(timeout=10)
        src = monitor.sources[0]
        # Some virtualised GPUs do not support Xid events; then it must say so.
        assert src.active or "support" in (src.reason or "") or src.reason
    finally:
        assert monitor.stop(timeout=5)


def test_reset_is_refused_by_default(real_gateway: None) -> None:
    d = check_reset(0, (), (), allow=False)
    assert not d.allowed and "off" in d.reason


def test_respawn_on_cuda_hands_over_and_recycles_the_retired_worker(
    tmp_path: Any, serve: Any
) -> None:
    """A real reload loop on the GPU: the new worker takes over, the retired one syncs its
    streams, frees its device memory and becomes the standby, no request fails."""
    import numpy as np

    from hotreload import Client
    from tests.support import Traffic, make_project, read_events, wait_until

    config = make_project(tmp_path)
    text = config.read_text().replace('device = "auto"', 'device = "cuda:0"')
    config.write_text(text.replace('strategy = "inplace"', 'strategy = "respawn"'))
    serve(config)
    client = Client(config=config, timeout_s=120)
    wait_until(lambda: client.status()["models"][0]["standby"] is not None, 120, what="the standby")
    traffic = Traffic(config, threads=2)
    try:
        for _ in range(3):
            outcome = client.reload("mlp", force=True)["outcomes"][0]
            assert outcome["ok"], outcome
    finally:
        traffic.stop()
    assert traffic.failures == []
    events = read_events(config)
    syncs = [e for e in events if e["kind"] == "phase_end" and e["phase"] == "sync"]
    assert syncs and all(e["ok"] and not e.get("skipped") for e in syncs[-3:])
    releases = [e for e in events if e["kind"] == "phase_end" and e["phase"] == "release"]
    assert all("kept as the next standby" in e["detail"] for e in releases[-3:])
    assert all("MiB of device memory freed" in e["detail"] for e in releases[-3:])
    out = client.infer("mlp", np.zeros((1, 64), np.float32))
    assert out.version == 4

"""Weights straight to the GPU, and device memory flat across reloads (marked `gpu`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 2**20


def test_weights_are_read_straight_onto_the_device(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from hotreload.worker.fast_build import skipped_init
    from hotreload.worker.weights import load_weights

    def build() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))

    path = tmp_path / "w.safetensors"
    save_file(build().state_dict(), str(path))
    with skipped_init():
        model = build()
    device = torch.device("cuda:0")
    load_weights(model, [str(path)], assign=True, device=device)
    assert {p.device for p in model.parameters()} == {device}
    from safetensors.torch import load_file

    ref = build()
    ref.load_state_dict(load_file(str(path)))
    x = torch.ones(3, 2048)
    torch.testing.assert_close(model(x.to(device)).cpu(), ref(x), rtol=1e-4, atol=1e-4)


def test_device_memory_back_to_baseline_after_20_in_place_reloads(
    tmp_path: Path, serve: Any
) -> None:
    from hotreload import Client
    from tests.support import make_project

    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('device = "auto"', 'device = "cuda:0"'))
    serve(config)
    client = Client(config=config, timeout_s=120)

    def allocated() -> int:
        time.sleep(1.0)  # the session reuses a worker reading younger than a moment
        worker = client.status()["models"][0].get("worker") or {}
        return int((worker.get("allocator") or {}).get("allocated_bytes") or 0)

    assert client.reload("mlp", force=True)["outcomes"][0]["ok"]
    first = allocated()
    for _ in range(20):
        outcome = client.reload("mlp", force=True)["outcomes"][0]
        assert outcome["ok"], outcome
    assert allocated() <= first + MiB

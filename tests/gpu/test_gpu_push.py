"""Pushed weights and shared weights on a real GPU (marked `gpu`: skipped without one).

The trainer's CUDA tensors go to the worker as CUDA IPC handles (one copy on the device);
CPU tensors through a memfd, read straight onto the device; a code edit with unchanged
weights files shares the serving version's device tensors instead of reading the file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MiB = 2**20


def cuda_project(tmp_path: Path) -> Path:
    from tests.support import make_project

    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('device = "auto"', 'device = "cuda:0"'))
    return config


def allocated(client: Any) -> int:
    time.sleep(1.0)  # the session reuses a worker reading younger than a moment
    worker = client.status()["models"][0].get("worker") or {}
    return int((worker.get("allocator") or {}).get("allocated_bytes") or 0)


@pytest.mark.parametrize("where", ["cuda", "cpu"], ids=["cuda-ipc", "memfd"])
def test_a_push_from_the_trainers_gpu_or_host_serves_and_matches(
    tmp_path: Path, serve: Any, where: str
) -> None:
    torch = pytest.importorskip("torch")
    import safetensors.torch

    from hotreload import Client
    from hotreload.worker.weights_digest import state_digest

    config = cuda_project(tmp_path)
    serve(config)
    client = Client(config=config, timeout_s=120)
    base = safetensors.torch.load_file(str(config.parent / "weights.safetensors"))
    state = {k: (v * 1.5).to(where) for k, v in base.items()}
    reply = client.update_weights("mlp", state)
    assert reply["version"] == 2
    assert reply["digest"] == state_digest(state)  # the worker holds exactly these bytes
    x = np.random.default_rng(1).standard_normal((4, 64), dtype=np.float32)
    result = client.infer("mlp", x, min_version=2)
    assert result.digest == reply["digest"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("mlp_gpu", config.parent / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build().to("cuda:0").eval()
    model.load_state_dict({k: v.to("cuda:0") for k, v in state.items()})
    with torch.inference_mode():
        expected = model(torch.from_numpy(x).to("cuda:0")).cpu().numpy()
    np.testing.assert_allclose(result.output, expected, rtol=1e-4, atol=1e-5)
    del state  # the trainer lets go of its tensors: the worker's copy serves on
    torch.cuda.empty_cache()
    assert client.infer("mlp", x).digest == reply["digest"]


def test_code_edits_share_the_device_weights_and_memory_stays_flat(
    tmp_path: Path, serve: Any
) -> None:
    from hotreload import Client

    config = cuda_project(tmp_path)
    serve(config)
    client = Client(config=config, timeout_s=120)
    first = allocated(client)
    model_py = config.parent / "model.py"
    for i in range(20):
        model_py.write_text(model_py.read_text() + f"\n# edit {i}\n")
        outcome = client.reload("mlp")["outcomes"][0]
        assert outcome["ok"], outcome
    # Shared, not a second copy per version: back to where it was after 20 code edits.
    assert allocated(client) <= first + MiB

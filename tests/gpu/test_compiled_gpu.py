"""A `mode="reduce-overhead"` model (CUDA graphs) re-captures its graphs in the warm phase
of a reload, never on a request, and serves right answers throughout: an in-place build
warms the new version on the loader thread while the serving thread replays the old one's
graphs, and both share the CUDA graph pool, so an output overwritten before it was copied
would show as a wrong value (issue 40; marked `gpu`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hotreload import Client
from tests.support import make_project

pytestmark = pytest.mark.gpu

MODEL = """
import torch
from torch import nn

SCALE = 1.0


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * SCALE


def build() -> nn.Module:
    torch.manual_seed(0)
    return torch.compile(Tiny(), mode="reduce-overhead", dynamic=False)


def example_input() -> torch.Tensor:
    return torch.ones(1, 64)
"""

CONFIG = """
[[models]]
name = "cg"
entry = "model.py:build"
example = "model.py:example_input"
device = "cuda:0"
warmup_iters = 1
"""


def serving_compiles(client: Client) -> int:
    return int(client.status()["models"][0]["worker"]["serving_compiles"])


def expected(x: np.ndarray, scale: float) -> np.ndarray:
    """The model's answer computed here, eagerly on the CPU in float64."""
    import torch

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    w = lin.weight.detach().double().numpy()
    b = lin.bias.detach().double().numpy()
    return np.maximum(x.astype(np.float64) @ w.T + b, 0.0) * scale


def check(x: np.ndarray, out: Any, version: int) -> None:
    scale = {1: 1.0, 2: 2.0}[version]
    # TF32 matmuls on the GPU: ~1e-3 relative; an overwritten output is off by far more.
    np.testing.assert_allclose(np.asarray(out), expected(x, scale), rtol=1e-2, atol=1e-2)


def test_cuda_graphs_are_captured_before_the_swap(tmp_path: Path, serve) -> None:
    config = make_project(tmp_path, config=CONFIG, files={"model.py": MODEL})
    serve(config)
    client = Client(config=config)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, 64), dtype=np.float32) for n in (1, 2, 4)]
    for x in inputs[:1] * 3:  # the example's shape: compiled and captured in the warm phase
        out, version, _ = client.infer("cg", x)
        check(x, out, version)
    assert serving_compiles(client) == 0
    for x in inputs[1:] * 3:  # new shapes: compiled and recorded on requests (the control)
        out, version, _ = client.infer("cg", x)
        check(x, out, version)
    before = serving_compiles(client)
    assert before > 0
    # Traffic at every served shape during the reload: the serving thread replays v1's
    # graphs while the loader thread warms v2's in the same pool.
    stop = threading.Event()
    served: list[tuple[np.ndarray, Any, int]] = []
    errors: list[BaseException] = []

    def traffic() -> None:
        mine = Client(config=config)
        try:
            i = 0
            while not stop.is_set() and i < 100_000:
                x = inputs[i % len(inputs)] + np.float32(i % 7)
                out, version, _ = mine.infer("cg", x)
                served.append((x, np.array(out, copy=True), version))
                i += 1
        except BaseException as exc:  # said by the test below
            errors.append(exc)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        path = config.parent / "model.py"
        path.write_text(path.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
        outcome = client.reload("cg", force=True)["outcomes"][0]
        assert outcome["ok"], outcome
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert {v for _, _, v in served} >= {1}, "no request was served during the reload"
    for x, out, version in served:
        check(x, out, version)
    for x in inputs * 3:
        out, version, _ = client.infer("cg", x)
        assert version == 2
        check(x, out, version)
    assert serving_compiles(client) == before, "a request compiled or recorded a CUDA graph"

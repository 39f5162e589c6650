"""Builds whose parameters come from a weights file skip their random initialization, and
the file's tensors become the parameters (fast_build.py). Real worker processes, real
files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from hotreload import Client
from tests.support import make_project

#: Records, in a file next to it, whether its parameter was initialised at build time.
RECORDING_MODEL = """
from pathlib import Path

import torch
from torch import nn

LOG = Path(__file__).with_name("inits.log")


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(4))
        nn.init.constant_(self.w, 7.0)
        with LOG.open("a") as f:
            f.write(f"{float(self.w[0]) == 7.0}\\n")

    def forward(self, x):
        return x * self.w


def build():
    return Scaled()


def example():
    return torch.ones(1, 4)
"""

#: Cannot build with initialization skipped: it reads back what init wrote.
NEEDS_INIT = RECORDING_MODEL.replace(
    "        with LOG.open",
    "        assert float(self.w.sum()) == 28.0, 'init skipped'\n        with LOG.open",
)

CONFIG = """
[[models]]
name = "scaled"
entry = "model.py:build"
example = "model.py:example"
weights = ["weights.safetensors"]
threads = 1
warmup_iters = 1
"""


def scaled_project(tmp_path: Path, source: str) -> Path:
    config = make_project(tmp_path, config=CONFIG, files={"model.py": source})
    save_file({"w": torch.tensor([1.0, 2.0, 3.0, 4.0])}, str(config.parent / "weights.safetensors"))
    return config


def test_a_build_from_weights_skips_initialization_and_serves_the_files_values(
    tmp_path: Path, serve
) -> None:
    config = scaled_project(tmp_path, RECORDING_MODEL)
    serve(config)
    out, _, _ = Client(config=config).infer("scaled", np.ones((1, 4), np.float32))
    assert out.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    # Every build of the served model ran without init (the file overwrote it anyway).
    assert set((config.parent / "inits.log").read_text().split()) == {"False"}


def test_a_factory_that_needs_its_initialization_is_built_with_it_and_says_so(
    tmp_path: Path, serve
) -> None:
    config = scaled_project(tmp_path, NEEDS_INIT)
    session = serve(config)
    session.wait_for("built it with initialization")
    out, _, _ = Client(config=config).infer("scaled", np.ones((1, 4), np.float32))
    assert out.tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_the_serving_version_survives_its_weights_file_being_rewritten_in_place(
    tmp_path: Path, serve
) -> None:
    # save functions truncate and rewrite the file; parameters over a mapping of it would
    # take the serving worker down with SIGBUS.
    config = make_project(tmp_path)
    serve(config)
    client = Client(config=config)
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    before = client.infer("mlp", x).output
    weights = config.parent / "weights.safetensors"
    weights.write_bytes(b"\\0" * 16)  # truncated mid-edit
    after, version, _ = client.infer("mlp", x)
    np.testing.assert_array_equal(after, before)
    assert version == 1

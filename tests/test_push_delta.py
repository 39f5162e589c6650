"""A LoRA-like trainer pushing to a real `hotreload serve`: the first push carries the
frozen base (100 MiB), later ones only the adapter; names without the factory's wrapper
prefix (`weights_prefix` applies to pushes); a delta over weights that no longer serve (the
files changed) is refused by the session and sent whole. Answers compared with the model
called in-process on the trainer's weights."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from hotreload import Client
from tests.support import count_events, make_project

LORA = '''
import torch
from torch import nn

DIM, RANK = 5120, 4  # the frozen base: 5120 x 5120 float32, 100 MiB


class LoRA(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(DIM, DIM, bias=False)
        self.a = nn.Parameter(torch.randn(RANK, DIM) * 0.01)  # b = 0: starts as the base
        self.b = nn.Parameter(torch.zeros(DIM, RANK))

    def forward(self, x):
        return self.base(x) + (x @ self.a.T) @ self.b.T


class Wrapped(nn.Module):
    """The factory wraps the trained model: its names are `lm.*`, the trainer's are not."""

    def __init__(self):
        super().__init__()
        self.lm = LoRA()

    def forward(self, x):
        return self.lm(x)


def build():
    return Wrapped()


def example_input():
    return torch.ones(1, DIM)
'''

CONFIG = """
[[models]]
name = "lora"
entry = "lora.py:build"
example = "lora.py:example_input"
weights = ["base.safetensors"]
weights_prefix = "lm."
device = "cpu"
threads = 1
warmup_iters = 1
strategy = "inplace"
"""


def _lora_module(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location("lora_here", folder / "lora.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("lora_here", None)
    spec.loader.exec_module(module)
    return module


def _train(model: Any, steps: int, seed: int) -> None:
    """A few steps on the adapter only (the base is frozen)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD([model.a, model.b], lr=1e-3)
    for _ in range(steps):
        x = torch.randn(4, model.base.in_features, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _answer_matches(client: Client, model: Any, version: int, digest: str) -> None:
    x = np.random.default_rng(3).standard_normal((2, 5120), dtype=np.float32)
    got = client.infer("lora", x, min_version=version, timeout_s=60)
    assert got.version >= version and got.digest == digest
    with torch.inference_mode():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got.output, want, rtol=1e-4, atol=1e-4)


def test_a_lora_push_costs_the_adapter_and_speaks_the_trainers_names(tmp_path: Path, serve) -> None:  # type: ignore[no-untyped-def]
    config = make_project(tmp_path, config=CONFIG, files={"lora.py": LORA})
    folder = config.parent
    torch.manual_seed(0)
    trainer_side = _lora_module(folder).LoRA()
    # The file holds the trainer's names (no `lm.`), as a checkpoint of it would.
    safetensors.torch.save_file(trainer_side.state_dict(), str(folder / "base.safetensors"))
    trainer_side.base.requires_grad_(False)
    serve(config)
    base_bytes = trainer_side.base.weight.numel() * 4
    adapter_bytes = (trainer_side.a.numel() + trainer_side.b.numel()) * 4
    with Client(config=config, timeout_s=120) as client:
        _train(trainer_side, 3, seed=1)
        first = client.update_weights("lora", trainer_side.state_dict(keep_vars=True), wait=False)
        served = first.result(120)
        assert first.sent_bytes >= base_bytes + adapter_bytes  # nothing pushed yet: all
        _train(trainer_side, 3, seed=2)
        second = client.update_weights("lora", trainer_side.state_dict(keep_vars=True), wait=False)
        reply = second.result(120)
        # The adapter's bytes alone (each tensor at a 64-byte boundary), whatever the base.
        assert (second.sent_tensors, second.skipped_tensors) == (2, 1)
        assert adapter_bytes <= second.sent_bytes <= adapter_bytes + 128
        assert reply["version"] == served["version"] + 1 and reply["digest"] != served["digest"]
        _answer_matches(client, trainer_side, reply["version"], reply["digest"])

        # The files change under the trainer (a new base): its next delta would lay the
        # adapter over weights nobody trained. The session refuses it; sent whole instead.
        other = {k: v + 1.0 for k, v in trainer_side.state_dict().items()}
        safetensors.torch.save_file(other, str(folder / "base.safetensors"))
        assert client.reload("lora", timeout_s=120)["outcomes"][0]["ok"]
        _train(trainer_side, 2, seed=3)
        state = trainer_side.state_dict(keep_vars=True)
        again = client.update_weights("lora", state, timeout_s=120)
        _answer_matches(client, trainer_side, again["version"], again["digest"])
    assert count_events(config, "reload_done", trigger="push") == 3


def test_weights_prefix_maps_pushed_names_and_leaves_the_models_own() -> None:
    from hotreload.worker.weight_sources import _pushed_names

    own = {"lm.w": 0, "lm.b": 0, "head": 0}
    t = torch.zeros(1)
    pushed = {"w": t, "lm.b": t, "head": t}  # the trainer's name, the model's, the model's
    assert sorted(_pushed_names(pushed, {"add": "lm."}, own)) == ["head", "lm.b", "lm.w"]
    # No prefix: names as pushed (a wrong one is then refused with the model's names).
    assert sorted(_pushed_names({"w": t}, None, own)) == ["w"]

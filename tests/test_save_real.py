"""`hotreload save` end to end in real workers: the serving weights, a push included, written
as safetensors under the model's own names load back into the model with the served digest
and answers; a Hugging Face model's folder loads with `from_pretrained`, bit for bit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hotreload import Client
from tests.support import import_file, make_project, shared_server

X = np.random.default_rng(5).standard_normal((2, 64), dtype=np.float32)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The worker runs torch on one thread (`threads = 1`); so does the model here, so that
    a matmul sums in the same order and the answers compare bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def save(config: Path, model: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotreload", "save", model, str(folder), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

CONFIG = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)


def build():
    torch.manual_seed(3)
    return GPT2LMHeadModel(CONFIG)


def example():
    return {"input_ids": torch.arange(8).reshape(1, 8)}
"""

GPT2_CONFIG = """
[[models]]
name = "gpt"
entry = "gpt.py:build"
example = "gpt.py:example"
device = "cpu"
threads = 1
warmup_iters = 1
"""


#: The tests on the module's session: `real` (they start workers), as tests/conftest.py marks
#: those that use the `serve` fixture, which a session shared by a module does not.
real = pytest.mark.real


@pytest.fixture(scope="module")
def saving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One session for the module's tests (its workers cost more than their saves): the
    example's "mlp", which only the first test pushes to, and "gpt", a Hugging Face model
    (where transformers is installed). Yields the config's path."""
    config = make_project(tmp_path_factory.mktemp("save"), files={"gpt.py": GPT2})
    if importlib.util.find_spec("transformers") is not None:
        config.write_text(config.read_text() + GPT2_CONFIG)
    with shared_server(config, ready_s=300):
        yield config


@real
def test_save_after_a_push_loads_back_with_the_served_digest_and_answers(
    saving: Path, tmp_path: Path, one_thread: None
) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from hotreload.worker.weights_digest import state_digest

    project = saving
    client = Client(config=project)
    pushed = {"out.bias": np.arange(10, dtype=np.float32)}
    assert client.update_weights("mlp", pushed, strict=False)["version"] == 2
    served = client.infer("mlp", X)
    out = tmp_path / "saved"
    done = save(project, "mlp", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"mlp: v2 saved to {out} (safetensors: ")
    assert served.digest is not None and served.digest in done.stdout
    state = load_file(str(out / "model.safetensors"))
    np.testing.assert_array_equal(state["out.bias"].numpy(), pushed["out.bias"])
    assert state_digest(state) == served.digest
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    assert (meta["hotreload_digest"], meta["hotreload_version"]) == (served.digest, "2")
    record = json.loads((out / "hotreload.json").read_text())
    assert (record["digest"], record["version"], record["files"]) == (
        served.digest,
        2,
        ["model.safetensors"],
    )
    module = import_file(project.parent / "model.py", "saved_mlp")
    model = module.build().eval()
    model.load_state_dict(state)  # strict: the model's own names, every one
    with torch.inference_mode():
        np.testing.assert_array_equal(model(torch.from_numpy(X)).numpy(), served.output)


@real
def test_save_names_what_to_fix(saving: Path, tmp_path: Path) -> None:
    project = saving
    (tmp_path / "a_file").write_text("")
    refused = save(project, "mlp", tmp_path / "a_file")
    assert refused.returncode != 0
    assert "a_file is a file; name a folder to save into" in refused.stderr
    unknown = save(project, "nope", tmp_path / "x")
    assert unknown.returncode != 0 and "unknown model 'nope'" in unknown.stderr


@real
def test_a_hugging_face_model_saves_a_folder_from_pretrained_loads_bit_for_bit(
    saving: Path, tmp_path: Path, one_thread: None
) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import GPT2LMHeadModel

    from hotreload.worker.weights_digest import state_digest

    config = saving
    client = Client(config=config)
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    served = client.infer("gpt", {"input_ids": ids})
    out = tmp_path / "gpt-saved"
    done = save(config, "gpt", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "save_pretrained" in done.stdout and (out / "config.json").exists()
    loaded = GPT2LMHeadModel.from_pretrained(out).eval()
    assert state_digest(loaded.state_dict()) == served.digest  # the weights, bit for bit
    with torch.inference_mode():
        logits = loaded(input_ids=torch.from_numpy(ids)).logits.numpy()
    answer = served.output["logits"] if isinstance(served.output, dict) else served.output
    np.testing.assert_allclose(logits, answer, rtol=0, atol=1e-5)


def test_a_state_entry_viewing_part_of_another_saves_as_its_own_tensor(tmp_path: Path) -> None:
    """A buffer that views part of a parameter (a slice of a fused qkv bias) shares its
    storage at another size: safetensors refuses two entries in one storage, so the save
    copies it, and each name loads back with its values."""
    import torch
    from safetensors.torch import load_file

    from hotreload.worker.save_weights import WEIGHTS_FILE, save_version

    class Fused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(4, 12)
            self.register_buffer("q_bias", self.qkv.bias.data[:4])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.qkv(x)

    model = Fused()
    reply = save_version(model, 1, tmp_path, name="fused", digest=None)
    assert reply.tensors == 3
    saved = load_file(str(tmp_path / WEIGHTS_FILE))
    torch.testing.assert_close(saved["q_bias"], model.qkv.bias.detach()[:4], rtol=0, atol=0)
    torch.testing.assert_close(saved["qkv.bias"], model.qkv.bias.detach(), rtol=0, atol=0)

"""`HotreloadPush` in a real Hugging Face `Trainer` run: a tiny Llama built from a config
(random weights, no download) trained for a few dozen steps on random tokens, pushing to a
live `hotreload serve` of the same architecture without waiting; the trainer's logs name
the versions and digests that served, and the last answer is the trained model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotreload import Client
from tests.support import make_project

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

LLAMA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
)


def build():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG))


def example_input():
    return {"input_ids": torch.arange(8).reshape(1, 8)}
"""

CONFIG = """
[[models]]
name = "llm"
entry = "llama.py:build"
example = "llama.py:example_input"
device = "cpu"
threads = 1
warmup_iters = 1
strategy = "inplace"
"""


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.rows = torch.randint(0, 128, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def tiny_llama() -> Any:
    """A 2-layer Llama from its config, seeded: the model a trainer pushes from."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            use_cache=False,
        )
    )  # fmt: skip


def train(model: Any, push: Any, out: Path, *, steps: int, rows: int) -> Any:
    """`steps` Trainer steps on CPU of `rows` token rows, with `push` as its callback; the
    Trainer (its log history)."""
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=4,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(rows), callbacks=[push]
    )
    trainer.train()
    return trainer


def test_a_trainer_pushes_every_n_steps_and_logs_what_serves(tmp_path: Path, serve) -> None:  # type: ignore[no-untyped-def]
    from hotreload.training import HotreloadPush

    torch.set_num_threads(1)  # two cores: the trainer and the served model, one each
    config = make_project(tmp_path, config=CONFIG, files={"llama.py": LLAMA})
    serve(config)
    model = tiny_llama()
    push = HotreloadPush(model="llm", every_n_steps=4, config=config, timeout_s=60)
    trainer = train(model, push, tmp_path / "out", steps=12, rows=32)

    assert push.errors == []
    # Pushes at steps 4, 8, 12 (the end waits for that of step 12): each served, or gave
    # way to a later one while it waited; the last one served.
    steps = [s for s, _, _ in push.served]
    assert steps[-1] == 12 and set(steps) <= {4, 8, 12}
    versions = [v for _, v, _ in push.served]
    assert versions == sorted(versions) and versions[0] >= 2
    logged = [e for e in trainer.state.log_history if "hotreload_version" in e]
    assert logged and logged[-1]["hotreload_version"] == versions[-1]
    assert logged[-1]["hotreload_digest"] == push.served[-1][2]

    x = np.arange(40, 48, dtype=np.int64).reshape(1, 8)  # the example's shape
    with Client(config=config) as client:
        got = client.infer("llm", {"input_ids": x}, min_version=versions[-1], timeout_s=60)
    assert got.version == versions[-1] and got.digest == push.served[-1][2]
    model.eval()
    with torch.inference_mode():
        want = model(input_ids=torch.from_numpy(x)).logits.numpy()
    logits = got.output["logits"] if isinstance(got.output, dict) else got.output
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)

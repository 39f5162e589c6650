"""The override warning on a real architecture (issue 38, item 12).

ModernBERT ties its decoder to the token embeddings and then pads the decoder's bias
(transformers' `_adjust_bias`): a copy of the memory the skipped init left as allocated,
different on every build. Every code edit, even one adding an unused constant, warned that
"build() sets decoder.bias to a new value". A value build() really sets still warns.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.engine.event_kinds import BaseEvent, WeightsOverride
from hotreload.engine.session import Session

transformers = pytest.importorskip("transformers")

MODEL = """import torch
from torch import nn
from transformers import AutoConfig, ModernBertForMaskedLM

SCALE = 1.0


def build():
    model = ModernBertForMaskedLM(AutoConfig.from_pretrained("ckpt"))
    # A value build() chooses, which the weights file then replaces.
    model.head.norm.weight = nn.Parameter(torch.full((32,), SCALE))
    return model


def example():
    return {
        "input_ids": torch.tensor([[1, 5, 6, 7, 2]]),
        "attention_mask": torch.ones(1, 5, dtype=torch.long),
    }
"""


def project(tmp_path: Path) -> Path:
    import torch

    proj = tmp_path / "proj"
    proj.mkdir()
    config = transformers.ModernBertConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        global_attn_every_n_layers=2,
        local_attention=16,
    )
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(config).save_pretrained(proj / "ckpt")
    (proj / "model.py").write_text(MODEL)
    (proj / "hotreload.toml").write_text(
        """[[models]]
name = "mb"
entry = "model.py:build"
example = "model.py:example"
weights = ["ckpt/model.safetensors"]
device = "cpu"
threads = 1
warmup_iters = 1
"""
    )
    return proj / "hotreload.toml"


def test_modernbert_warns_of_an_override_only_when_build_sets_a_new_value(
    tmp_path: Path,
) -> None:
    config_path = project(tmp_path)
    model_py = config_path.parent / "model.py"

    async def main() -> list[str]:
        session = Session(load_config(config_path), endpoint=False, telemetry=False)
        seen: list[BaseEvent] = []
        session.events.subscribe(seen.append)

        def warnings() -> list[str]:
            return [e.message for e in seen if isinstance(e, WeightsOverride)]

        try:
            await session.start()
            model_py.write_text(MODEL + "\nUNUSED = 1\n")  # changes no value build() sets
            edited = await session.reload_model("mb", trigger="file", detail=["model.py"])
            assert edited.ok and edited.version == 2, edited
            assert warnings() == []
            model_py.write_text(MODEL.replace("SCALE = 1.0", "SCALE = 2.0"))
            scaled = await session.reload_model("mb", trigger="file", detail=["model.py"])
            assert scaled.ok and scaled.version == 3, scaled
            return warnings()
        finally:
            await session.stop()

    said = asyncio.run(asyncio.wait_for(main(), 120))
    assert len(said) == 1, said
    assert said[0].startswith("v3's build() sets head.norm.weight to a new value"), said
    assert "decoder.bias" not in said[0]

"""Checkpoints as transformers' `save_pretrained` writes them (original names, experts one
by one, shards) load as `from_pretrained` loads them: the weights are from_pretrained's to
the bit (compared tensor by tensor in process, by content digest when served), and the
served answers equal its answers within float32 rounding.

The families: ViT and DeiT (renamed keys), Mixtral (41 per-expert tensors in the file, 21
fused ones in the module; served from a sharded checkpoint), each built from its config at
a small but real size with random weights. Real worker processes, real files."""

from __future__ import annotations

import json
import runpy
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hotreload import Client
from hotreload.worker.fast_build import build_without_init
from hotreload.worker.load_error import LoadError
from hotreload.worker.weights import load_weights
from hotreload.worker.weights_digest import state_digest
from tests.support import read_events

pytest.importorskip("transformers")

VISION = """
import torch
from transformers import {cls}, {config}

CONFIG = {config}(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
    image_size=32, patch_size=8, num_labels=3,
)


def build():
    return {cls}(CONFIG)


def example():
    return {{"pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))}}
"""

MIXTRAL = """
import torch
from transformers import MixtralConfig, MixtralForCausalLM

CONFIG = MixtralConfig(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
    num_experts_per_tok=2, max_position_embeddings=64, use_cache=False,
)


def build():
    return MixtralForCausalLM(CONFIG)


def example():
    return {"input_ids": torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(0))}
"""

FAMILIES = {
    "vit": VISION.format(cls="ViTForImageClassification", config="ViTConfig"),
    "deit": VISION.format(cls="DeiTForImageClassification", config="DeiTConfig"),
    "mixtral": MIXTRAL,
}

MODEL = """
[[models]]
name = "{name}"
entry = "{name}.py:build"
example = "{name}.py:example"
weights = ["{weights}"]
device = "cpu"
threads = 1
warmup_iters = 1
"""

#: Served (DeiT's conversion is ViT's kind, proven in process above: one worker fewer).
SERVED = ("vit", "mixtral")
#: Mixtral in six shards: experts' w1 and w3 (fused into one tensor) in different shards.
SHARD_SIZE = "60KB"
INDEX = "mixtral/model.safetensors.index.json"


def build(proj: Path, name: str) -> torch.nn.Module:
    (proj / f"{name}.py").write_text(textwrap.dedent(FAMILIES[name]))
    return runpy.run_path(str(proj / f"{name}.py"))["build"]()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_save_pretrained_checkpoint_loads_as_from_pretrained_loads_it(
    tmp_path: Path, name: str
) -> None:
    torch.manual_seed(0)
    build(tmp_path, name).save_pretrained(tmp_path / name)
    reference = type(build(tmp_path, name)).from_pretrained(tmp_path / name)
    model = build_without_init(lambda: build(tmp_path, name), print)
    load_weights(model, [str(tmp_path / name / "model.safetensors")], assign=True)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


def test_a_checkpoint_of_another_model_names_the_keys_left_after_conversion(
    tmp_path: Path,
) -> None:
    build(tmp_path, "deit").save_pretrained(tmp_path / "deit")
    model = build(tmp_path, "vit")
    with pytest.raises(LoadError) as err:
        load_weights(model, [str(tmp_path / "deit" / "model.safetensors")])
    text = str(err.value)
    assert text.startswith("weights do not match the model (missing keys: ")
    assert "unexpected keys: deit." in text
    assert "after transformers' key conversion (ViTForImageClassification: " in text


def saved_project(tmp_path: Path, names: tuple[str, ...] = SERVED) -> tuple[Path, dict[str, Any]]:
    """A folder with the code of the models `names` and what save_pretrained wrote for each
    (default arguments; Mixtral sharded); the config, and each model as from_pretrained
    loads it."""
    proj = tmp_path / "proj"
    proj.mkdir()
    loaded, config = {}, ""
    for name in names:
        torch.manual_seed(len(name))
        sharded = {"max_shard_size": SHARD_SIZE} if name == "mixtral" else {}
        build(proj, name).save_pretrained(proj / name, **sharded)
        loaded[name] = type(build(proj, name)).from_pretrained(proj / name).eval()
        weights = INDEX if sharded else f"{name}/model.safetensors"
        config += MODEL.format(name=name, weights=weights)
    (proj / "hotreload.toml").write_text(config)
    return proj / "hotreload.toml", loaded


def last_load(config: Path, model: str) -> str:
    loads = [
        e
        for e in read_events(config)
        if e["kind"] == "phase_end" and e["phase"] == "load" and e.get("model") == model
    ]
    return str(loads[-1]["detail"])


def resave_shard(proj: Path, shard: str) -> None:
    """One shard written again with new values, the others left as they are."""
    from safetensors.torch import save_file

    path = proj / "mixtral" / shard
    save_file({k: v * 2 for k, v in load_file(str(path)).items()}, str(path), {"format": "pt"})


@pytest.mark.slow
@pytest.mark.timeout(400)  # two workers importing transformers on two busy cores
def test_save_pretrained_checkpoints_serve_as_from_pretrained_loads_them(
    tmp_path: Path, serve
) -> None:
    config, loaded = saved_project(tmp_path)
    proj = config.parent
    shards = sorted(set(json.loads((proj / INDEX).read_text())["weight_map"].values()))
    stored = {"vit": load_file(str(proj / "vit" / "model.safetensors"))}
    for shard in shards:
        stored.setdefault("mixtral", {}).update(load_file(str(proj / "mixtral" / shard)))
    # What the issue found: the file's names are not the module's.
    assert "vit.encoder.layer.0.attention.attention.key.bias" in stored["vit"]
    assert "vit.layers.0.attention.k_proj.bias" in loaded["vit"].state_dict()
    assert (len(stored["mixtral"]), len(loaded["mixtral"].state_dict())) == (41, 21)
    assert len(shards) == 6

    serve(config, wait_ready=False).wait_ready(timeout=300)
    client = Client(config=config, timeout_s=120)
    rng = np.random.default_rng(0)
    inputs = {
        "vit": {"pixel_values": rng.standard_normal((2, 3, 32, 32), dtype=np.float32)},
        "mixtral": {"input_ids": rng.integers(0, 96, (2, 8)).astype(np.int64)},
    }

    def check(name: str, reference: Any, version: int) -> str:
        reply = client.infer(name, inputs[name])
        assert reply.version == version
        # The weights are from_pretrained's to the bit.
        assert reply.digest == state_digest(reference.state_dict()), name
        with torch.inference_mode():
            x = {k: torch.from_numpy(v) for k, v in inputs[name].items()}
            expected = reference(**x).logits.numpy()
        got = reply.output["logits"] if isinstance(reply.output, dict) else reply.output
        # The same weights in another process, with another thread count: equal within
        # float32 rounding of another summation order (never one CPU's exact bits).
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        return str(reply.digest)

    for name in SERVED:
        check(name, loaded[name], 1)

    # A code edit shares the converted tensors with the serving version: nothing read or
    # converted again, the same digest.
    code = proj / "mixtral.py"
    code.write_text(code.read_text() + "\n# an edit\n")
    assert client.reload("mixtral")["outcomes"][0]["ok"]
    assert "21 weight tensor(s) shared with the serving version" in last_load(config, "mixtral")
    check("mixtral", loaded["mixtral"], 2)

    # One shard saved again: only it is read (embeddings, attention of layer 0), the
    # tensors of the five others are shared; the weights are what from_pretrained reads now.
    resave_shard(proj, shards[0])
    assert client.reload("mixtral")["outcomes"][0]["ok"]
    detail = last_load(config, "mixtral")
    assert "1 of 6 weights file(s) read" in detail, detail
    check("mixtral", type(loaded["mixtral"]).from_pretrained(proj / "mixtral").eval(), 3)

    # A shard whose experts are fused with another shard's (w1 here, w3 there): both read.
    resave_shard(proj, shards[1])
    assert client.reload("mixtral")["outcomes"][0]["ok"]
    assert "2 of 6 weights file(s) read" in last_load(config, "mixtral")
    check("mixtral", type(loaded["mixtral"]).from_pretrained(proj / "mixtral").eval(), 4)


@pytest.mark.slow
@pytest.mark.timeout(400)  # two workers importing transformers on two busy cores
def test_under_respawn_a_code_edit_maps_the_converted_checkpoint_in_the_standby(
    tmp_path: Path, serve
) -> None:
    """strategy respawn: the next version is built in another process, which maps the
    serving worker's weights block (the tensors as converted, the fused Mixtral experts
    included) instead of reading and converting the files again."""
    # Mixtral alone (its conversion fuses experts across shards): one worker and a standby.
    config, loaded = saved_project(tmp_path, ("mixtral",))
    proj = config.parent
    config.write_text(MODEL.format(name="mixtral", weights=INDEX) + 'strategy = "respawn"\n')
    serve(config, wait_ready=False).wait_ready(timeout=300)
    client = Client(config=config, timeout_s=120)
    ids = np.random.default_rng(1).integers(0, 96, (2, 8)).astype(np.int64)
    reference = loaded["mixtral"]
    with torch.inference_mode():
        expected = reference(input_ids=torch.from_numpy(ids)).logits.numpy()
    before = client.status()["models"]
    pid = next(m["pid"] for m in before if m["name"] == "mixtral")
    code = proj / "mixtral.py"
    code.write_text(code.read_text() + "\n# an edit\n")
    assert client.reload("mixtral")["outcomes"][0]["ok"]
    detail = last_load(config, "mixtral")
    assert "21 weight tensor(s) mapped from the serving worker's memory" in detail, detail
    now = next(m for m in client.status()["models"] if m["name"] == "mixtral")
    assert now["pid"] != pid and now["version"] == 2
    reply = client.infer("mixtral", {"input_ids": ids})
    assert reply.digest == state_digest(reference.state_dict())  # from_pretrained's, bit for bit
    got = reply.output["logits"] if isinstance(reply.output, dict) else reply.output
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

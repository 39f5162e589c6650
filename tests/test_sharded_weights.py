"""A sharded checkpoint's index in `weights`: the config reads it as its shards, and the plan
of a build names the shards unchanged since the serving version read them (only those are
shared; the re-saved ones are read). The end-to-end proof, with a Mixtral served from six
shards, is in test_hf_checkpoints.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.engine.model.pushes import Overlay, files_signature, plan_weights
from hotreload.errors import ConfigError

CONFIG = """
[[models]]
name = "lm"
entry = "model.py:build"
example = "model.py:example"
weights = ["lm/model.safetensors.index.json"]
"""


def sharded(tmp_path: Path, shards: int = 3) -> Path:
    (tmp_path / "model.py").write_text("def build(): ...\ndef example(): ...\n")
    folder = tmp_path / "lm"
    folder.mkdir()
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for name in names:
        (folder / name).write_bytes(b"x")
    weight_map = {f"layer.{i}.weight": names[i % shards] for i in range(2 * shards)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "hotreload.toml").write_text(CONFIG)
    return tmp_path / "hotreload.toml"


def test_an_index_stands_for_its_shards_in_name_order(tmp_path: Path) -> None:
    (model,) = load_config(sharded(tmp_path)).models
    assert [p.name for p in model.weights] == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]


def test_an_index_naming_a_missing_shard_says_which(tmp_path: Path) -> None:
    config = sharded(tmp_path)
    (tmp_path / "lm" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert "names shard(s) that do not exist: model-00002-of-00003.safetensors" in str(err.value)


def test_a_build_after_one_shard_is_saved_again_shares_the_others(tmp_path: Path) -> None:
    (model,) = load_config(sharded(tmp_path)).models
    held = files_signature(model)
    os.utime(model.weights[1], ns=(1, 1))  # shard 2 saved again
    plan = plan_weights(model, [], held, same_worker=True, restart=False, push=None)
    assert (plan.reuse, plan.unchanged_files) == (False, [0, 2])
    assert plan.wire()["unchanged_files"] == [0, 2]
    # Not across workers, and not where pushes lie over the serving tensors.
    other = plan_weights(model, [], held, same_worker=False, restart=False, push=None)
    assert other.unchanged_files is None
    pushed = Overlay(1, {"tensors": []}, True)
    assert (
        plan_weights(
            model, [pushed], held, same_worker=True, restart=False, push=None
        ).unchanged_files
        is None
    )

"""A version's file weights in one shared block: a respawn worker maps it instead of reading
the files again (worker/shared_weights.py, engine/model/pushes.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from hotreload import Client
from hotreload.worker.shared_weights import copy_into_block, map_block
from tests.support import make_project, read_events
from tests.test_push_weights import X as PUSH_X
from tests.test_push_weights import file_state, in_process, trained

X = np.random.default_rng(23).standard_normal((2, 64), dtype=np.float32)


def test_a_block_maps_in_another_process_without_a_copy(tmp_path: Path) -> None:
    state = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "n": torch.tensor(7, dtype=torch.int64),
    }
    tensors, block = copy_into_block(state)
    try:
        assert all(torch.equal(tensors[k], state[k]) for k in state)
        d = block.descriptor()
        assert all(e["offset"] % 64 == 0 for e in d["tensors"])
        code = (
            "import sys, json, torch\n"
            "from hotreload.worker.shared_weights import map_block\n"
            "t = map_block(json.loads(sys.argv[1]))\n"
            "print(t['w'].sum().item(), t['b'].float().tolist(), t['n'].item())\n"
        )
        import json

        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(d)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["66.0", "[1.5,", "-2.0]", "7"]
        mapped = map_block(d)  # here too: the same pages, not a copy
        tensors["w"][0, 0] = 100.0
        assert mapped["w"][0, 0].item() == 100.0
    finally:
        block.close()


def test_a_respawn_code_edit_maps_the_weights_and_replays_the_pushes_a_weights_edit_reads_them(
    tmp_path: Path, serve
) -> None:  # type: ignore[no-untyped-def]
    """One respawn session: a code edit maps the serving worker's weights block; a weights
    edit reads the file; then, over pushes, a code edit replays them in the new worker."""
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"'))
    serve(config)
    client = Client(config=config, timeout_s=60)
    before = client.infer("mlp", X)
    model_py = config.parent / "model.py"
    model_py.write_text(model_py.read_text() + "\n# a code edit\n")
    assert client.reload("mlp")["outcomes"][0]["ok"]
    edited = client.infer("mlp", X)
    assert edited.version == 2 and edited.digest == before.digest
    np.testing.assert_array_equal(edited.output, before.output)
    loads = [e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "load"]
    assert "mapped from the serving worker's memory" in loads[-1]["detail"], loads[-1]
    # New weights: read from the file, not mapped from the old block.
    import safetensors.torch

    path = config.parent / "weights.safetensors"
    state = safetensors.torch.load_file(str(path))
    safetensors.torch.save_file({k: v * 2 for k, v in state.items()}, str(path))
    assert client.reload("mlp")["outcomes"][0]["ok"]
    loads = [e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "load"]
    assert "mapped" not in loads[-1]["detail"], loads[-1]
    assert client.infer("mlp", X).digest != before.digest

    # Pushes, then a code edit: the new worker replays them over the file's weights.
    first = trained(file_state(config), 5)
    client.update_weights("mlp", first)
    head = {k: v * 0.5 for k, v in first.items() if k.startswith("out.")}
    pushed = client.update_weights("mlp", head, strict=False)["digest"]
    pid = client.status()["models"][0]["pid"]
    model_py.write_text(model_py.read_text() + "\n# an edit of the code only\n")
    outcome = client.reload("mlp")["outcomes"][0]
    assert outcome["ok"], outcome
    assert client.status()["models"][0]["pid"] != pid, "built in another worker"
    result = client.infer("mlp", PUSH_X)
    assert result.digest == pushed  # the files' weights, then both pushes, in order
    expected = in_process(config, {**first, **head})
    np.testing.assert_allclose(result.output, expected, rtol=1e-5, atol=1e-6)


BIG_MODEL = """
import torch
from torch import nn

SCALE = 1.0


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(1600, 1600)  # 9.8 MiB: above the snapshot's link size

    def forward(self, x):
        return self.layer(x) * SCALE


def build():
    return Wide()


def example():
    return torch.ones(1, 1600)
"""


def test_a_code_edit_of_a_model_with_a_linked_weights_file_shares_its_tensors(
    tmp_path: Path, serve
) -> None:  # type: ignore[no-untyped-def]
    """The snapshot hard-links a weights file over 8 MiB, which moves its change time on
    every reload: "unchanged" must not look at it (it did, and nothing was ever shared)."""
    import safetensors.torch

    proj = tmp_path / "big"
    proj.mkdir()
    (proj / "model.py").write_text(BIG_MODEL)
    torch.manual_seed(0)
    layer = torch.nn.Linear(1600, 1600)
    safetensors.torch.save_file(
        {"layer.weight": layer.weight.detach(), "layer.bias": layer.bias.detach()},
        str(proj / "weights.safetensors"),
    )
    config = proj / "hotreload.toml"
    config.write_text(
        '[[models]]\nname = "wide"\nentry = "model.py:build"\nexample = "model.py:example"\n'
        'weights = ["weights.safetensors"]\nthreads = 1\n'
    )
    serve(config)
    client = Client(config=config, timeout_s=60)
    for scale in ("2.0", "3.0"):
        code = proj / "model.py"
        code.write_text(code.read_text().replace("SCALE = 1.0", f"SCALE = {scale}", 1))
        assert client.reload("wide")["outcomes"][0]["ok"]
        loads = [
            e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "load"
        ]
        assert "2 weight tensor(s) shared with the serving version" in loads[-1]["detail"], loads
        code.write_text(BIG_MODEL)

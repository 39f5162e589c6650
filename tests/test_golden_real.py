"""Golden outputs end to end, on the example MLP in real worker processes: an edit of SCALE
shows how far the answers moved, a pure refactor says "outputs identical", `expect = "same"`
refuses an answer-changing edit while the old version keeps serving, and `hotreload diff`
compares kept versions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hotreload import Client
from tests.support import count_events, read_events, wait_until

X = np.random.default_rng(3).standard_normal((1, 64), dtype=np.float32)


def edit(config: Path, old: str, new: str) -> None:
    path = config.parent / "model.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def outcomes(config: Path, n: int) -> list[dict]:
    def done() -> bool:
        return count_events(config, "reload_done") + count_events(config, "reload_failed") >= n

    wait_until(done, 60, what=f"{n} reload outcome(s)")
    return [e for e in read_events(config) if e["kind"] in ("reload_done", "reload_failed")]


def run_diff(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotreload", "diff", "mlp", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def with_golden(config: Path, *extra: str) -> None:
    """The example's `golden` line switched on (it ships commented out), and `extra` keys."""
    line = 'golden = "model.py:golden"'
    text = config.read_text()
    assert "# " + line in text
    config.write_text(text.replace("# " + line, "\n".join((line, *extra)), 1))


def test_scale_edit_shows_the_change_and_a_refactor_is_identical(project: Path, serve) -> None:
    with_golden(project)
    serve(project, "--no-tui", command="watch")
    client = Client(config=project)
    edit(project, "SCALE = 1.0", "SCALE = 2.0")
    scaled = outcomes(project, 1)[-1]
    assert scaled["kind"] == "reload_done", scaled
    diff = scaled["golden"]
    assert (diff["from"], diff["to"]) == (1, 2) and not diff["identical"]
    # The example and the config's one golden input (examples/mlp golden()).
    assert diff["inputs"] == 2 and all(e["max_abs"] > 0 for e in diff["outputs"])
    status = client.status()["models"][0]
    assert status["golden"]["to"] == 2 and not status["golden"]["identical"]
    # A refactor: the same arithmetic written another way.
    edit(project, "return self.out(h) * SCALE", "y = self.out(h)\n        return y * SCALE")
    refactor = outcomes(project, 2)[-1]
    assert refactor["kind"] == "reload_done", refactor
    assert refactor["golden"]["identical"] and (refactor["golden"]["to"]) == 3
    # `hotreload diff`: default the serving version and the one before; or two named.
    out = run_diff(project, "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["from"], got["to"], got["identical"]) == (2, 3, True)
    out = run_diff(project, "1", "3", "--json")
    got = json.loads(out.stdout)
    assert (got["from"], got["to"], got["identical"]) == (1, 3, False)
    assert all(e["max_abs"] > 0 for e in got["outputs"])
    text = run_diff(project, "1", "2").stdout
    assert text.startswith("v1 -> v2: outputs changed on 2 golden inputs") and "max abs" in text
    missing = run_diff(project, "1", "9")
    assert missing.returncode != 0 and "no golden outputs kept for version 9" in missing.stderr


def test_expect_same_refuses_a_changed_answer_and_the_old_version_serves(
    project: Path, serve
) -> None:
    with_golden(project, 'expect = "same"')
    serve(project, "--no-tui", command="watch")
    client = Client(config=project)
    before, v1, _ = client.infer("mlp", X)
    edit(project, "SCALE = 1.0", "SCALE = 2.0")
    refused = outcomes(project, 1)[-1]
    assert refused["kind"] == "reload_failed" and refused["phase"] == "smoke", refused
    assert 'expect = "same"' in refused["error"] and "max abs" in refused["error"]
    model = client.status()["models"][0]
    assert model["version"] == 1 and model["state"] == "serving"
    after, served_by, _ = client.infer("mlp", X)
    assert (v1, served_by) == (1, 1) and np.array_equal(np.asarray(after), np.asarray(before))
    # The edit undone as a refactor: bit-equal answers pass the gate.
    edit(project, "SCALE = 2.0", "SCALE = 1.0 * 1")
    passed = outcomes(project, 2)[-1]
    assert passed["kind"] == "reload_done" and passed["golden"]["identical"], passed


BIG = """
import torch
from torch import nn

VOCAB = 50257


class Big(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        # 100 x 50257 float32 logits: 19 MiB, past the 16 MiB golden outputs carry.
        return torch.zeros(x.shape[0], VOCAB) + x.sum() + self.bias


def build():
    return Big()


def example():
    return torch.zeros(100, 4)
"""


def test_a_model_with_a_large_example_output_starts_and_reloads(project: Path, serve) -> None:
    (project.parent / "big.py").write_text(BIG)
    text = project.read_text()
    text = text.replace('entry = "model.py:build"', 'entry = "big.py:build"')
    text = text.replace('example = "model.py:example_input"', 'example = "big.py:example"')
    project.write_text(text.replace('weights = ["weights.safetensors"]', ""))
    serve(project, "--no-tui", command="watch")  # waits until it serves: it started
    big = project.parent / "big.py"
    big.write_text(big.read_text().replace("x.sum() +", "x.sum() * 1 +"))
    done = outcomes(project, 1)[-1]
    assert done["kind"] == "reload_done", done
    said = [
        e["message"]
        for e in read_events(project)
        if e["kind"] == "model_note" and "not compared" in e["message"]
    ]
    assert len(said) == 1 and "past the 16 MiB" in said[0], said  # said once, both versions

"""Rollback end to end on the example MLP in a real worker: an edit of SCALE, a push, then
`hotreload rollback` back to each; the answers equal the earlier version's bit for bit and
the model called in this process with that version's code and weights."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hotreload import Client
from tests.support import import_file, read_events

X = np.random.default_rng(7).standard_normal((3, 64), dtype=np.float32)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The worker runs torch on one thread (`threads = 1`); so does its twin here, so that
    a matmul sums in the same order and the answers compare bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def twin(config: Path, tag: str, state: dict[str, Any] | None = None) -> np.ndarray:
    """The answer of the example's model.py as it is on disk now, called in this process,
    with the weights file's tensors (and `state` over them, as a push lays them)."""
    import torch
    from safetensors.torch import load_file

    module = import_file(config.parent / "model.py", f"rollback_twin_{tag}")
    model = module.build().eval()
    weights = load_file(str(config.parent / "weights.safetensors"))
    weights.update({k: torch.from_numpy(v) for k, v in (state or {}).items()})
    model.load_state_dict(weights)
    with torch.inference_mode():
        return model(torch.from_numpy(X)).numpy()


def rollback(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotreload", "rollback", "mlp", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rollback_serves_an_edit_and_a_push_back_bit_for_bit(
    project: Path, serve, one_thread: None
) -> None:
    serve(project)
    client = Client(config=project)
    v1 = client.infer("mlp", X)
    assert v1.version == 1
    np.testing.assert_array_equal(v1.output, twin(project, "v1"))
    rng = np.random.default_rng(11)
    pushed = {"out.weight": rng.standard_normal((10, 512), dtype=np.float32) * np.float32(0.05)}
    assert client.update_weights("mlp", pushed, strict=False)["version"] == 2
    v2 = client.infer("mlp", X)
    np.testing.assert_array_equal(v2.output, twin(project, "v2", pushed))
    model_py = project.parent / "model.py"
    model_py.write_text(model_py.read_text().replace("SCALE = 1.0", "SCALE = 2.0", 1))
    assert client.reload("mlp")["outcomes"][0]["version"] == 3
    v3 = client.infer("mlp", X)
    np.testing.assert_array_equal(v3.output, twin(project, "v3", pushed))
    assert not np.array_equal(v3.output, v2.output)

    back = rollback(project, "1")  # the code before the edit, the weights before the push
    assert back.returncode == 0, back.stdout + back.stderr
    assert back.stdout.startswith("mlp: rollback to v1 -> v4"), back.stdout
    v4 = client.infer("mlp", X)
    assert v4.version == 4 and v4.digest == v1.digest
    np.testing.assert_array_equal(v4.output, v1.output)

    again = rollback(project)  # the default: the version before the serving one, v3
    assert again.returncode == 0 and "rollback to v3 -> v5" in again.stdout, again.stdout
    v5 = client.infer("mlp", X)
    np.testing.assert_array_equal(v5.output, v3.output)  # the edit and the push, again
    assert v5.digest == v3.digest

    done = [e for e in read_events(project) if e["kind"] == "reload_done"]
    assert [e["trigger"] for e in done[-2:]] == ["rollback", "rollback"]

    missing = rollback(project, "1")  # keep_versions = 3: v3, v4, v5 are kept
    assert missing.returncode != 0
    assert "v1 is not kept (kept: v3, v4, v5)" in missing.stdout + missing.stderr
    assert client.infer("mlp", X).version == 5


def test_a_rollback_of_a_code_edit_shares_the_serving_weights(project: Path, serve) -> None:
    serve(project)
    client = Client(config=project)
    v1 = client.infer("mlp", X)
    model_py = project.parent / "model.py"
    model_py.write_text(model_py.read_text().replace("SCALE = 1.0", "SCALE = 3.0", 1))
    client.reload("mlp")
    back = rollback(project)
    assert back.returncode == 0, back.stdout + back.stderr
    load = [e for e in read_events(project) if e["kind"] == "phase_end" and e["phase"] == "load"]
    # Nothing read again: the weights files and pushes of v1 are those serving.
    assert "shared with the serving version" in load[-1]["detail"], load[-1]
    np.testing.assert_array_equal(client.infer("mlp", X).output, v1.output)


def test_a_rollback_builds_from_its_snapshot_when_a_module_it_imported_is_gone(
    project: Path, serve
) -> None:
    """v1 imports `helper` and reads `data.json` beside its code; v2 renames the module and
    edits the data: `rollback 1` builds from v1's snapshot (as a restart does), so it imports
    v1's helper and reads v1's data, and answers as v1 did."""
    root = project.parent
    model_py = root / "model.py"
    src = model_py.read_text()
    (root / "helper.py").write_text("FACTOR = 1.0\n")
    (root / "data.json").write_text('{"bias": 0.0}')
    read = (
        "import json as _json\nimport pathlib as _pathlib\n"
        "_BIAS = _json.loads((_pathlib.Path(__file__).parent / 'data.json').read_text())['bias']\n"
    )
    model_py.write_text(
        "import helper\n"
        + read
        + src.replace("SCALE = 1.0", "SCALE = 1.0 + _BIAS * helper.FACTOR", 1)
    )
    serve(project)
    client = Client(config=project)
    v1 = client.infer("mlp", X)
    (root / "helper2.py").write_text("FACTOR = 1.0\n")
    model_py.write_text(
        model_py.read_text().replace("import helper\n", "import helper2 as helper\n", 1)
    )
    (root / "helper.py").unlink()
    (root / "data.json").write_text('{"bias": 2.0}')
    assert client.reload("mlp")["outcomes"][0]["version"] == 2
    assert not np.array_equal(client.infer("mlp", X).output, v1.output)
    back = rollback(project, "1")
    assert back.returncode == 0, back.stdout + back.stderr
    v3 = client.infer("mlp", X)
    assert v3.version == 3
    np.testing.assert_array_equal(v3.output, v1.output)

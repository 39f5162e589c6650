"""`hotreload export triton`: the repository it writes, and the models it refuses, with the
messages a user reads. (tests/triton/ runs the exports on a real tritonserver.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload.cli import main
from hotreload.export.bundle import bundle_source
from tests.support import REPO, make_project

SEQ_MODEL = """
import torch

class Seq(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask[..., None]
        return {"hidden": h, "pooled": h.sum(1), "skipped": None}

def build():
    return Seq()

def example():
    return {"input_ids": torch.arange(6).reshape(1, 6),
            "attention_mask": torch.ones(1, 6, dtype=torch.long)}
"""

SEQ_CONFIG = """
[[models]]
name = "seq"
entry = "seq.py:build"
example = "seq.py:example"
device = "cpu"
warmup_iters = 2
shapes = { input_ids = [-1, -1], attention_mask = [-1, -1] }
env = { MY_FLAG = "on" }
"""


def export(
    config: Path, out: Path, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = main(["export", "triton", str(out), "--config", str(config), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_example_exports_as_a_python_backend_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path)
    out = tmp_path / "repo"
    code, printed, err = export(config, out, capsys=capsys)
    assert code == 0, err
    model = out / "mlp"
    text = (model / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and "max_batch_size: 0" in text
    assert '{ name: "input" data_type: TYPE_FP32 dims: [ -1, 64 ] }' in text
    assert '{ name: "output" data_type: TYPE_FP32 dims: [ -1, 10 ] }' in text
    assert "kind: KIND_AUTO" in text  # device = "auto"
    assert 'key: "intra_op_threads" value { string_value: "1" }' in text
    assert 'key: "env.PYTORCH_CUDA_ALLOC_CONF"' in text
    assert "count: 3" in text and 'input_data_file: "input_0"' in text
    # The example input, raw: 64 float32.
    assert (model / "warmup" / "input_0").stat().st_size == 64 * 4
    version = model / "1"
    for name in ("model.py", "hotreload_rules.py", "hotreload_export.json"):
        assert (version / name).is_file(), name
    assert (version / "code" / "model.py").is_file()
    record = json.loads((version / "hotreload_export.json").read_text())
    assert record["entry"]["file"] == "model.py"
    assert record["weights"] == ["code/weights.safetensors"]
    assert "exported 'mlp'" in printed
    # What the model imports, not the client scripts beside it (nor their requirements).
    assert not (version / "code" / "client.py").exists()
    assert not (version / "code" / "make_weights.py").exists()
    assert (
        "left out 2 Python file(s) the model does not import: client.py, make_weights.py" in printed
    )
    assert "hotreload" not in printed.split("must contain:")[1].split("\n")[0]
    # Which weights went out, with the digest serving shows for them.
    assert record["weights_digest"].startswith("sha256:")
    assert f"the files' weights, digest {record['weights_digest']}" in printed
    assert "Triton's Python environment must contain: torch==" in printed
    assert "safetensors==" in printed and "numpy==" in printed
    # Nothing half-written is left beside it.
    assert sorted(p.name for p in out.iterdir()) == ["mlp"]


def test_declared_shapes_dict_inputs_nested_outputs_and_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path, config=SEQ_CONFIG, files={"seq.py": SEQ_MODEL})
    code, _, err = export(config, tmp_path / "repo", capsys=capsys)
    assert code == 0, err
    text = (tmp_path / "repo" / "seq" / "config.pbtxt").read_text()
    assert '{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }' in text
    assert '{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1, -1 ] }' in text
    # An input free past its batch: every output dimension may vary.
    assert '{ name: "hidden" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }' in text
    assert '{ name: "pooled" data_type: TYPE_FP32 dims: [ -1, -1 ] }' in text
    assert "skipped" not in text
    assert "kind: KIND_CPU" in text
    assert 'key: "env.MY_FLAG" value { string_value: "on" }' in text
    assert "dims: [ 1, 6 ] input_data_file" in text


def test_model_option_exports_only_that_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path, files={"seq.py": SEQ_MODEL})
    config.write_text(config.read_text().replace("[watch]", SEQ_CONFIG + "\n[watch]"))
    out = tmp_path / "repo"
    code, _, err = export(config, out, "--model", "seq", capsys=capsys)
    assert code == 0, err
    assert [p.name for p in out.iterdir()] == ["seq"]
    code, _, err = export(config, out, "--model", "sqe", capsys=capsys)
    assert code == 2
    assert "no model named 'sqe'; the config declares: mlp, seq" in err


def test_a_factory_that_raises_fails_the_export_with_its_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = "def build():\n    raise ValueError('no such layer: blocks.9')\n\ndef example(): ...\n"
    config = make_project(
        tmp_path,
        config='[[models]]\nname = "bad"\nentry = "bad.py:build"\nexample = "bad.py:example"\n',
        files={"bad.py": bad},
    )
    out = tmp_path / "repo"
    code, _, err = export(config, out, capsys=capsys)
    assert code == 1
    assert "'bad' cannot be exported: building the model raised ValueError: no such layer" in err
    assert 'bad.py", line 2, in build' in err
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "return torch.ones(1, 2, dtype=torch.complex64)",
            "output 'output' has dtype complex64, which Triton has no type for",
        ),
        ("return x.sum()", "output 'output' is a scalar (shape [])"),
    ],
)
def test_what_triton_cannot_describe_fails_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    model = (
        "import torch\n\ndef build():\n    def f(x):\n        " + body + "\n    return f\n\n"
        "def example():\n    return torch.ones(1, 2)\n"
    )
    config = make_project(
        tmp_path,
        config='[[models]]\nname = "odd"\nentry = "odd.py:build"\nexample = "odd.py:example"\n',
        files={"odd.py": model},
    )
    out = tmp_path / "repo"
    code, _, err = export(config, out, capsys=capsys)
    assert code == 1
    assert message in err
    assert list(out.iterdir()) == []  # no repository Triton would refuse later


def test_a_folder_that_is_not_an_export_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path)
    (tmp_path / "repo" / "mlp").mkdir(parents=True)
    (tmp_path / "repo" / "mlp" / "keep.txt").write_text("mine")
    code, _, err = export(config, tmp_path / "repo", capsys=capsys)
    assert code == 1
    assert "exists and is not a hotreload export; remove it or choose another OUT_DIR" in err
    assert (tmp_path / "repo" / "mlp" / "keep.txt").read_text() == "mine"
    # A second export over a first one replaces it.
    code, _, err = export(config, tmp_path / "repo2", capsys=capsys)
    code, _, err = export(config, tmp_path / "repo2", capsys=capsys)
    assert code == 0, err


def test_an_export_inside_the_code_folder_does_not_copy_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path)
    out = config.parent / "triton_repo"
    # Inside the watched folder and not ignored: every file written would set off a reload.
    code, _, err = export(config, out, capsys=capsys)
    assert code == 2 and "which hotreload watches for model 'mlp'" in err, err
    assert 'add "triton_repo/**" to [watch] ignore first' in err and not out.exists()
    config.write_text(
        config.read_text().replace("[watch]\n", '[watch]\nignore = ["triton_repo/**"]\n')
    )
    for _ in range(2):
        code, _, err = export(config, out, capsys=capsys)
        assert code == 0, err
    assert not (out / "mlp" / "1" / "code" / "triton_repo").exists()


def test_the_loading_rules_run_without_hotreload(tmp_path: Path) -> None:
    """hotreload_rules.py is hotreload's own code taken out of the package: it must import
    and work where hotreload is not installed."""
    (tmp_path / "hotreload_rules.py").write_text(bundle_source())
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'hotreload':\n"
        "            raise ImportError('hotreload is not installed here')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import torch, hotreload_rules as r\n"
        "form, ex = r.normalise_example({'a': torch.ones(1, 2), 'b': 'text'})\n"
        "print(form, sorted(ex), ex['b'])\n"
        "print(sorted(r.normalise_output({'x': (None, [torch.ones(1)])})[1]))\n"
        "m = r.resolve({'spec': 'model.py:build', 'file': "
        f"{str(REPO / 'examples' / 'mlp' / 'model.py')!r}, 'module': None, 'attr': 'build'}},"
        " None)()\n"
        "try:\n"
        f"    r.load_weights(m, [{str(tmp_path / 'none.safetensors')!r}], torch.device('cpu'))\n"
        "except r.LoadError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "dict ['a', 'b'] ['text']"
    assert lines[1] == "['x.1.0']"
    assert lines[2].endswith("none.safetensors does not exist")


def test_only_the_python_files_the_model_imports_go_out(tmp_path: Path) -> None:
    from hotreload.export.imports_closure import unimported_files

    (tmp_path / "pkg").mkdir()
    files = {
        "model.py": "import helpers\nfrom pkg import sub\n",
        "helpers.py": "from . import nothing_here\n",
        "pkg/__init__.py": "",
        "pkg/sub.py": "from .other import x\n",
        "pkg/other.py": "x = 1\n",
        "example.py": "import torch\n",
        "client.py": "import model\nfrom hotreload import Client\n",
        "unused.py": "import requests\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    left = unimported_files(tmp_path, [tmp_path / "model.py", tmp_path / "example.py"])
    assert [p.as_posix() for p in left] == ["client.py", "unused.py"]


def test_export_beside_a_session_with_pushed_weights_says_which_weights_went_out(
    tmp_path: Path, serve, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    from hotreload import Client

    config = make_project(tmp_path)
    serve(config)
    with Client(config=config) as client:
        state = {"out.bias": np.full((10,), 0.5, np.float32)}
        pushed = client.update_weights("mlp", state, strict=False)
    code, printed, err = export(config, tmp_path / "repo", capsys=capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "repo" / "mlp" / "1" / "hotreload_export.json").read_text())
    assert record["weights_digest"] != pushed["digest"]
    assert f"answers 'mlp' with weights {pushed['digest']} (1 push(es)" in printed, printed
    assert f"this export holds the files' weights ({record['weights_digest']})" in printed

"""Config parsing: every bad config names the file, the key and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotreload.cli import main
from hotreload.config import load_config
from hotreload.errors import ConfigError

GOOD_MODEL = """
[[models]]
name = "mlp"
entry = "model.py:build"
example = "model.py:example_input"
"""


def write(tmp_path: Path, text: str, name: str = "hotreload.toml") -> Path:
    (tmp_path / "model.py").write_text(
        "def build():\n    return abs\n\ndef example_input():\n    return 0\n"
    )
    (tmp_path / "w.safetensors").write_bytes(b"")
    path = tmp_path / name
    path.write_text(text)
    return path


def error_for(tmp_path: Path, text: str, name: str = "hotreload.toml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message, "the error must name the file"
    return message


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD_MODEL))
    m = cfg.models[0]
    assert (m.name, m.device, m.max_queue_size, m.policy, m.strategy) == (
        "mlp",
        "auto",
        256,
        "auto",
        "inplace",
    )
    assert m.entry.file == (tmp_path / "model.py").resolve() and m.entry.attr == "build"
    assert m.watch == (tmp_path.resolve(),), "default watch path is the entry file's folder"
    assert cfg.state_dir == tmp_path / ".hotreload"
    assert (cfg.watch.quiet_ms, cfg.watch.max_wait_ms) == (100, 1500)


def test_full_config_round_trip(tmp_path: Path) -> None:
    text = (
        GOOD_MODEL
        + """
weights = ["w.safetensors"]
device = "cuda:1"
threads = { intra_op = 2, inter_op = 1 }
env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }
policy = "resource"
strategy = "respawn"
build_pace = 0
ignore = ["*.log"]
[models.deadlines]
drain_s = 2
sync_s = 0.5

[[models]]
name = "other"
entry = "pkg.mod:make"
example = "pkg.mod:example"
threads = 3

[watch]
quiet_ms = 50
max_wait_ms = 500
[gpu]
reset = "on-wedge"
[check]
reloads = 5
p99_ms = 20
[http]
enabled = true
port = 9000
"""
    )
    cfg = load_config(write(tmp_path, text))
    a, b = cfg.models
    assert a.device == "cuda:1" and a.threads and a.threads.intra_op == 2
    assert a.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert a.deadlines.drain_s == 2 and a.deadlines.sync_s == 0.5 and a.deadlines.load_s == 120
    assert b.entry.module == "pkg.mod" and b.threads and b.threads.inter_op == 3
    assert a.build_pace == 0.0 and b.build_pace == 3.0
    assert cfg.gpu.reset == "on-wedge" and cfg.check.p99_ms == 20 and cfg.http.port == 9000


def test_pyproject_tool_table(tmp_path: Path) -> None:
    text = GOOD_MODEL.replace("[[models]]", "[[tool.hotreload.models]]")
    cfg = load_config(write(tmp_path, '[project]\nname = "x"\n' + text, "pyproject.toml"))
    assert cfg.models[0].name == "mlp"


def test_discovery_prefers_hotreload_toml_in_cwd(tmp_path: Path) -> None:
    write(tmp_path, GOOD_MODEL)
    assert load_config(cwd=tmp_path).path.name == "hotreload.toml"


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("", "models", "no models declared"),
        ("models = 3", "models", "expected a list"),
        (GOOD_MODEL + "warmup_iter = 3", "models[0].warmup_iter", "did you mean 'warmup_iters'?"),
        (GOOD_MODEL + "[wach]\n", "wach", "did you mean 'watch'?"),
        (GOOD_MODEL + "warmup_iters = -1", "models[0].warmup_iters", "integer between 0 and 10000"),
        (GOOD_MODEL + "warmup_iters = true", "models[0].warmup_iters", "got a boolean"),
        (GOOD_MODEL + 'max_queue_size = "big"', "models[0].max_queue_size", "expected an integer"),
        (GOOD_MODEL + 'device = "gpu"', "models[0].device", "'auto', 'cpu' or 'cuda:N'"),
        (GOOD_MODEL + 'policy = "availabilty"', "models[0].policy", "did you mean 'availability'?"),
        (GOOD_MODEL + 'strategy = "restart"', "models[0].strategy", "inplace, respawn"),
        (GOOD_MODEL + 'weights = ["missing.pt"]', "models[0].weights[0]", "does not exist"),
        (GOOD_MODEL + "threads = 0", "models[0].threads", "count >= 1"),
        (
            GOOD_MODEL + "threads = { intra = 2 }",
            "models[0].threads.intra",
            "did you mean 'intra_op'?",
        ),
        (GOOD_MODEL + "env = { A = 1 }", "models[0].env.A", "expected a string value"),
        (GOOD_MODEL + "request_timeout_s = 0", "models[0].request_timeout_s", ">= 0.001"),
        (GOOD_MODEL + "build_pace = -1", "models[0].build_pace", "(0 = never pause) >= 0"),
        (GOOD_MODEL + 'build_pace = "slow"', "models[0].build_pace", "expected a factor"),
        (GOOD_MODEL + "recycle = -1", "models[0].recycle", "integer between 0 and 1000000"),
        (GOOD_MODEL + "recycle = 2.5", "models[0].recycle", "expected an integer"),
        (
            GOOD_MODEL + "[models.deadlines]\ndrain = 3",
            "models[0].deadlines.drain",
            "did you mean 'drain_s'?",
        ),
        (GOOD_MODEL + 'watch = ["nowhere"]', "models[0].watch[0]", "does not exist"),
        (
            GOOD_MODEL.replace('"model.py:build"', '"model.py"'),
            "models[0].entry",
            "expected 'package.module:callable'",
        ),
        (
            GOOD_MODEL.replace('"model.py:build"', '"nope.py:build"'),
            "models[0].entry",
            "does not exist",
        ),
        (
            GOOD_MODEL.replace('"model.py:build"', '"model.py:1x"'),
            "models[0].entry",
            "not a Python name",
        ),
        (GOOD_MODEL.replace('name = "mlp"\n', ""), "models[0].name", "missing"),
        (GOOD_MODEL.replace('"mlp"', '"bad name!"'), "models[0].name", "expected letters"),
        (GOOD_MODEL + GOOD_MODEL, "models[1].name", "duplicate model name 'mlp'"),
        (
            GOOD_MODEL + "[watch]\nquiet_ms = 500\nmax_wait_ms = 100",
            "watch.max_wait_ms",
            "must be >= quiet_ms",
        ),
        (GOOD_MODEL + '[gpu]\nreset = "always"', "gpu.reset", "never, on-wedge, ask"),
        (
            GOOD_MODEL + "expected_output = { shape = [1, -2] }",
            "models[0].expected_output.shape",
            "integers >= -1",
        ),
    ],
)
def test_bad_config_names_key_and_expectation(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    message = error_for(tmp_path, text)
    assert f": {key}: " in message, message
    assert expected in message, message


def test_invalid_toml_is_reported_with_position(tmp_path: Path) -> None:
    message = error_for(tmp_path, "[[models]\nname = 1")
    assert "not valid TOML" in message and "line 1" in message


def test_pyproject_without_table(tmp_path: Path) -> None:
    assert "[tool.hotreload]" in error_for(tmp_path, '[project]\nname = "x"\n', "pyproject.toml")


def test_missing_config_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hotreload init"):
        load_config(cwd=tmp_path)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


def test_serve_with_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD_MODEL + "warmup_iter = 3")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "warmup_iter" in err and "did you mean 'warmup_iters'?" in err


def test_init_writes_a_config_that_loads(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("def build(): ...\ndef example_input(): ...\n")
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "init"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    cfg = load_config(cwd=tmp_path)
    assert cfg.models[0].name == "model" and cfg.check.reloads == 3
    again = subprocess.run(
        [sys.executable, "-m", "hotreload", "init"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2 and "already exists" in again.stderr

"""Config mistakes found before start-up: exit 2 at once, naming the config file; a missing
device exits 3 as the README's exit-code table says; a misspelt entry says what was meant."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.preflight import missing_name
from tests.support import make_project


def run(config: Path, command: str = "serve", *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotreload", command, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.parent,
    )


def edited(tmp_path: Path, old: str, new: str) -> Path:
    config = make_project(tmp_path)
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))
    return config


def test_unavailable_cpus_exit_2_with_the_file_before_anything_starts(tmp_path: Path) -> None:
    config = edited(tmp_path, "threads = 1 ", "cpus = [99]\nthreads = 1 ")
    out = run(config)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{config}: models.mlp.cpus: CPU 99 is not available" in out.stderr
    assert out.stdout == ""  # no banner, no worker, no socket
    assert not (config.parent / ".hotreload").exists()


@pytest.mark.parametrize("command", ["serve", "check"])
def test_a_misspelt_entry_function_says_did_you_mean_before_start(
    tmp_path: Path, command: str
) -> None:
    config = edited(tmp_path, 'entry = "model.py:build"', 'entry = "model.py:biuld"')
    out = run(config, command)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{config}: models.mlp.entry: model.py:biuld" in out.stderr
    assert "did you mean 'build'?" in out.stderr
    assert not (config.parent / ".hotreload").exists()


def test_a_misspelt_module_entry_says_did_you_mean_when_the_worker_loads(tmp_path: Path) -> None:
    # A module name is not read ahead (finding its file imports its packages): the worker
    # finds it, with the same hint.
    config = edited(tmp_path, 'entry = "model.py:build"', 'entry = "model:biuld"')
    out = run(config)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "module 'model' has no attribute 'biuld'; did you mean 'build'?" in out.stdout


def test_a_missing_cuda_device_exits_3(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine may have the GPU; the test needs one without")
    config = edited(tmp_path, 'device = "auto"', 'device = "cuda:99"')
    out = run(config)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "device 'cuda:99' was asked for" in out.stdout


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def biuld(): pass\n", True),
        ("from torch.nn import *\n", True),  # cannot tell: left to the worker
        ("def __getattr__(name): ...\n", True),
        ("globals()['biuld'] = print\n", True),
        ("try:\n    import x\nexcept ImportError:\n    def biuld(): pass\n", True),
        ("if True:\n    biuld = lambda: 1\n", True),
        ("import os as biuld\n", True),
        ("def build(): pass\nclass Biuldr: pass\n", False),
    ],
)
def test_what_counts_as_defined(tmp_path: Path, source: str, found: bool) -> None:
    config = edited(tmp_path, 'entry = "model.py:build"', 'entry = "other.py:biuld"')
    (config.parent / "other.py").write_text(source)
    problem = missing_name(load_config(config).models[0].entry)
    assert (problem is None) == found, problem
    if not found:
        assert problem and "did you mean 'build'?" in problem and "Biuldr" in problem

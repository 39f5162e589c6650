"""Completion offers the config's model names where a command takes one, in real bash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload.cli import build_parser, main
from hotreload.commands.completion import bash_script, model_names, zsh_script

TWO_MODELS = """
[[models]]
name = "encoder"
entry = "model.py:build"
example = "model.py:example"

[[models]]
name = "ranker"
entry = "model.py:build"
example = "model.py:example"
"""


def _bash_complete(words: list[str], cwd: Path) -> list[str]:
    """What bash offers for the last of `words`, run in `cwd` with this venv's `hotreload`
    first on PATH (as in a shell where it is installed)."""
    script = bash_script(build_parser())
    line = " ".join(f"'{w}'" for w in words)
    cmd = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_hotreload_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    res = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_model_names_from_hotreload_toml_pyproject_or_an_explicit_config(tmp_path: Path) -> None:
    (tmp_path / "hotreload.toml").write_text(TWO_MODELS)
    assert model_names(cwd=tmp_path) == ["encoder", "ranker"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[[tool.hotreload.models]]\nname = "solo"\n'
    )
    assert model_names(cwd=other) == ["solo"]
    assert model_names("other", cwd=tmp_path) == ["solo"]  # a folder, as --config takes
    assert model_names(str(other / "pyproject.toml"), cwd=tmp_path) == ["solo"]
    # No config, or a broken one: nothing offered, nothing printed, nothing raised.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "hotreload.toml").write_text("[[models]\nname=")
    assert model_names(cwd=tmp_path / "broken") == []
    assert model_names(cwd=tmp_path / "broken" / "missing") == []


def test_hidden_model_names_command_prints_one_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hotreload.toml").write_text(TWO_MODELS)
    monkeypatch.chdir(tmp_path)
    assert main(["completion", "--model-names"]) == 0
    assert capsys.readouterr().out.split() == ["encoder", "ranker"]
    # Hidden: the help a user reads does not list it.
    with pytest.raises(SystemExit):
        main(["completion", "--help"])
    assert "--model-names" not in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_model_names_where_a_command_takes_one(tmp_path: Path) -> None:
    (tmp_path / "hotreload.toml").write_text(TWO_MODELS)
    assert _bash_complete(["hotreload", "reload", ""], tmp_path) == ["encoder", "ranker"]
    assert _bash_complete(["hotreload", "status", "r"], tmp_path) == ["ranker"]
    assert _bash_complete(["hotreload", "check", "--model", ""], tmp_path) == [
        "encoder",
        "ranker",
    ]
    assert _bash_complete(["hotreload", "export", "triton", "out", "--model", "e"], tmp_path) == [
        "encoder"
    ]
    # Options still complete after a dash; --config elsewhere is the config read.
    assert "--json" in _bash_complete(["hotreload", "reload", "--j"], tmp_path)
    elsewhere = tmp_path / "proj"
    elsewhere.mkdir()
    (elsewhere / "hotreload.toml").write_text('[[models]]\nname = "cnn"\n')
    assert _bash_complete(["hotreload", "reload", "--config", "proj", ""], tmp_path) == ["cnn"]
    assert _bash_complete(["hotreload", "reload", ""], elsewhere) == ["cnn"]


def test_zsh_script_names_the_model_completer() -> None:
    script = zsh_script(build_parser())
    assert "_hotreload_models() {" in script
    assert "'1::model:_hotreload_models'" in script  # reload MODEL, status MODEL
    assert "--model[" in script and ":model:_hotreload_models'" in script


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_model_completer_reads_the_config_typed_or_the_folders(tmp_path: Path) -> None:
    (tmp_path / "hotreload.toml").write_text(TWO_MODELS)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "hotreload.toml").write_text('[[models]]\nname = "cnn"\n')
    # compadd stubbed to print what it is given: _arguments needs a live completion widget.
    cmd = (
        "compdef() { :; }\n" + zsh_script(build_parser()) + "\n"
        'compadd() { shift; print -l -- "${(@P)1}"; }\n'
        "_hotreload_prog=hotreload\n"
        'words=(reload ""); _hotreload_models\n'
        'words=(check --config proj --model ""); _hotreload_models\n'
    )
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    res = subprocess.run(
        ["zsh", "-f", "-c", cmd], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["encoder", "ranker", "cnn"]

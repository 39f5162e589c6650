"""The basics a newcomer looks for: --version, colour, completion, LICENSE, init, config."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload import __version__
from hotreload.cli import build_parser, main
from hotreload.colour import wants_colour
from hotreload.commands.completion import bash_script, zsh_script
from hotreload.commands.init import STARTER
from hotreload.commands.printer import PlainPrinter
from hotreload.config import find_config

REPO = Path(__file__).resolve().parent.parent


def test_version_flag() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hotreload", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 0 and res.stdout.strip() == f"hotreload {__version__}"


# -- colour ------------------------------------------------------------------------------

READY = {"kind": "ready", "model": "mlp", "version": 2, "device": "cpu", "pid": 7, "ts": 0.0}


def test_colour_in_a_terminal_but_not_in_a_pipe_or_under_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    leader, follower = os.openpty()
    read_end, write_end = os.pipe()
    with open(follower, "w") as tty, open(write_end, "w") as pipe:
        assert wants_colour(tty) and not wants_colour(pipe)
        out = io.StringIO()
        out.isatty = tty.isatty  # type: ignore[method-assign]  # a terminal we can read back
        PlainPrinter(out)(READY)
        assert "\033[32m" in out.getvalue() and "v2 ready on cpu" in out.getvalue()
        monkeypatch.setenv("NO_COLOR", "1")
        assert not wants_colour(tty)
        plain = io.StringIO()
        plain.isatty = tty.isatty  # type: ignore[method-assign]
        PlainPrinter(plain)(READY)
        assert "\033[" not in plain.getvalue() and "v2 ready on cpu" in plain.getvalue()
    os.close(leader)
    os.close(read_end)


# -- completion --------------------------------------------------------------------------


def bash_complete(words: list[str]) -> list[str]:
    """What bash offers for the last of `words`, from the generated script, in real bash."""
    script = bash_script(build_parser())
    line = " ".join(f"'{w}'" for w in words)
    cmd = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_hotreload_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_offers_commands_options_and_choices() -> None:
    assert bash_complete(["hotreload", "ch"]) == ["check"]
    assert "--reloads" in bash_complete(["hotreload", "check", "--re"])
    assert bash_complete(["hotreload", "completion", "z"]) == ["zsh"]
    assert "--owner" not in bash_complete(["hotreload", "dashboard", "--"])  # hidden stays


def test_completion_command_prints_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#compdef hotreload") and "'check:pre-commit smoke check" in out


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_script_parses() -> None:
    res = subprocess.run(
        ["zsh", "-n", "-c", zsh_script(build_parser())], capture_output=True, timeout=30
    )
    assert res.returncode == 0, res.stderr


# -- files a newcomer reads --------------------------------------------------------------


def test_license_matches_pyproject() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a stub
    assert 'license = { text = "Apache-2.0" }' in (REPO / "pyproject.toml").read_text()


def test_init_template_agrees_with_the_readme() -> None:
    # The README: `hotreload check` checks a config; .hotreload carries its own .gitignore.
    assert "Check it with: hotreload check" in STARTER
    assert "hotreload serve --config" not in STARTER
    assert "add it to .gitignore" not in STARTER


def test_a_hotreload_toml_beside_a_tool_table_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hotreload.toml").write_text("")
    (tmp_path / "pyproject.toml").write_text("[tool.hotreload]\nmodels = []\n")
    assert find_config(cwd=tmp_path) == tmp_path / "hotreload.toml"
    err = capsys.readouterr().err
    assert "warning: using" in err and "[tool.hotreload] table in" in err
    assert "pyproject.toml is ignored" in err


def test_a_pyproject_without_a_tool_table_does_not_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hotreload.toml").write_text("")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert find_config(cwd=tmp_path) == tmp_path / "hotreload.toml"
    assert capsys.readouterr().err == ""


def test_readme_installs_cpu_torch_before_hotreload() -> None:
    """Without it, a CPU-only machine downloads the multi-GB CUDA build with hotreload."""
    readme = (REPO / "README.md").read_text()
    cpu = readme.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert cpu < readme.index("pip install /path/to/hotreload", cpu)


def test_first_set_up_says_what_it_installs_and_why_it_takes_a_while(tmp_path: Path) -> None:
    """scripts/bootstrap.sh (run by demo.sh and test.sh) with a stand-in interpreter, so
    nothing is installed: the first run announces itself, a second one is silent."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    for name in ("requirements-ci.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
    (bin_dir / "python").chmod(0o755)

    def bootstrap() -> subprocess.CompletedProcess[str]:
        script = tmp_path / "scripts" / "bootstrap.sh"
        return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)

    first = bootstrap()
    assert first.returncode == 0, first.stderr
    assert "installing the pinned dependencies" in first.stderr
    assert "takes about a minute" in first.stderr and "torch" in first.stderr
    assert "pip install" in (bin_dir / "calls").read_text()
    second = bootstrap()
    assert second.returncode == 0 and second.stderr == ""

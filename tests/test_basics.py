"""The basics a newcomer looks for: --version, colour, completion, LICENSE, init, config."""

from __future__ import annotations

import argparse
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
from hotreload.engine.event_kinds import Ready

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


def _commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, str]]:
    """(`export triton`, its --help text) for every subcommand, nested ones too."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((f"{path}{name}", sub.format_help()))
                found += _commands(sub, f"{path}{name} ")
    return found


def test_every_command_help_says_what_it_does_and_shows_a_typical_use() -> None:
    commands = dict(_commands(build_parser()))
    assert {"init", "serve", "watch", "status", "reload", "doctor", "export triton"} <= set(
        commands
    )
    for name, text in commands.items():
        _, _, rest = text.partition("\n\n")
        description = " ".join(rest.split("\n\n")[0].split())
        # The paragraph between the usage and the arguments, ending in an example.
        assert not description.startswith(("options:", "positional arguments:")), name
        assert f"hotreload {name}" in description, f"`hotreload {name} --help`: {description!r}"


# -- colour ------------------------------------------------------------------------------

READY = Ready(model="mlp", version=2, device="cpu", pid=7, load_s=0.0, warm_s=0.0, ts=0.0)


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


class _Bootstrap:
    """scripts/bootstrap.sh (run by demo.sh and test.sh) in a copy of the repository's set-up
    files, with a stand-in interpreter that records its arguments: nothing is installed."""

    def __init__(self, root: Path) -> None:
        (root / "scripts").mkdir(parents=True)
        shutil.copy(REPO / "scripts" / "bootstrap.sh", root / "scripts" / "bootstrap.sh")
        for name in ("requirements-demo.txt", "requirements-ci.txt", "pyproject.toml"):
            shutil.copy(REPO / name, root / name)
        self.root = root
        self.calls = root / ".venv" / "bin" / "calls"
        python = self.calls.with_name("python")
        python.parent.mkdir(parents=True)
        python.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
        python.chmod(0o755)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Runs it; the pip installs it made are in `installs` afterwards."""
        before = self.installs()
        script = self.root / "scripts" / "bootstrap.sh"
        res = subprocess.run(
            ["bash", str(script), *args], capture_output=True, text=True, timeout=60
        )
        self.made = self.installs()[len(before) :]
        return res

    def installs(self) -> list[str]:
        text = self.calls.read_text() if self.calls.exists() else ""
        return [line for line in text.splitlines() if "pip install" in line]


def test_the_demo_installs_its_own_set_and_says_so(tmp_path: Path) -> None:
    """The demo installs what it runs (requirements-demo.txt), not the tests' set, announces
    the wait first, and a second run installs nothing and says nothing."""
    bootstrap = _Bootstrap(tmp_path)
    first = bootstrap("demo")
    assert first.returncode == 0, first.stderr
    assert "installing the pinned dependencies of requirements-demo.txt" in first.stderr
    assert "takes about a minute" in first.stderr and "torch" in first.stderr
    assert any("-r requirements-demo.txt" in c for c in bootstrap.made), bootstrap.made
    assert not any("requirements-ci.txt" in c for c in bootstrap.made), bootstrap.made
    again = bootstrap("demo")
    assert again.returncode == 0 and again.stderr == "" and bootstrap.made == []


def test_the_tests_add_to_the_demos_set_and_the_demo_reuses_theirs(tmp_path: Path) -> None:
    """Demo then tests: the tests install the rest; tests first: the demo installs nothing."""
    demo_first = _Bootstrap(tmp_path / "a")
    demo_first("demo")
    tests = demo_first()
    assert tests.returncode == 0, tests.stderr
    assert "adding to the demo's set" in tests.stderr
    assert any("-r requirements-ci.txt" in c for c in demo_first.made), demo_first.made
    for args in ((), ("demo",)):
        again = demo_first(*args)
        assert again.returncode == 0 and again.stderr == "" and demo_first.made == []

    tests_first = _Bootstrap(tmp_path / "b")
    assert tests_first("--check", "demo").returncode == 1  # nothing set up yet
    tests = tests_first()
    assert "installing the pinned dependencies of requirements-ci.txt" in tests.stderr
    demo = tests_first("demo")
    assert demo.returncode == 0 and demo.stderr == "" and tests_first.made == []


def test_the_demo_set_pins_exactly_what_the_package_depends_on() -> None:
    """demo.sh installs requirements-demo.txt, then the package with --no-deps: a dependency
    added to pyproject.toml but not pinned there would be missing from the demo's .venv."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {
        Requirement(d).name.lower()
        for d in deps
        if Requirement(d).marker is None or Requirement(d).marker.evaluate()
    }
    lines = (REPO / "requirements-demo.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert all(str(p.specifier).startswith("==") for p in pins), pins
    assert {p.name.lower() for p in pins} == wanted
    ci = (REPO / "requirements-ci.txt").read_text()
    assert "-r requirements-demo.txt" in ci.splitlines()  # one place for each pin
    assert not any(f"\n{p.name}==" in ci for p in pins), "pin it in requirements-demo.txt only"


def test_a_changed_pin_installs_again_and_a_wrong_argument_is_named(tmp_path: Path) -> None:
    bootstrap = _Bootstrap(tmp_path)
    bootstrap()
    with (tmp_path / "requirements-demo.txt").open("a") as f:
        f.write("# a pin moved\n")
    assert bootstrap("demo").returncode == 0 and bootstrap.made, "a stale stamp was trusted"
    wrong = bootstrap("tests")
    assert wrong.returncode == 2
    assert "unknown argument 'tests' (expected demo, ci or --check)" in wrong.stderr

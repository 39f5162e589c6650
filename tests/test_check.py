"""`hotreload check` on the example and on broken variants of it: real workers, CPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, import_file, make_project


def run_check(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotreload", "check", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
    )


def test_example_passes_and_json_holds_every_figure(project: Path) -> None:
    out = run_check(project, "--json", "--p99-ms", "1000")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and "running on the CPU" in doc["note"]
    (model,) = doc["models"]
    assert model["device"] == "cpu" and model["policy"] == "availability"
    steps = {s["name"]: s for s in model["steps"]}
    assert list(steps) == ["load+warm", "infer", "reload 1", "reload 2", "reload 3", "p99", "xid"]
    assert all(s["ok"] for s in steps.values())
    assert steps["load+warm"]["figures"]["load_s"] > 0
    assert len(steps["load+warm"]["figures"]["warm_passes_ms"]) == 3
    assert steps["infer"]["figures"]["outputs"][0]["shape"] == [1, 10]
    reload3 = steps["reload 3"]["figures"]
    assert reload3["version"] == 4 and reload3["memory_kind"] == "worker RSS"
    assert {"load", "warm", "smoke", "swap"} <= set(reload3["phases"])
    assert isinstance(reload3["growth_bytes"], int)
    assert steps["p99"]["figures"]["p99_ms"] > 0 and steps["xid"]["figures"]["xid_events"] == 0


BROKEN = {
    "factory raises": (
        "\ndef build():\n    raise RuntimeError('factory refuses to build')\n",
        "factory refuses to build",
    ),
    "NaN output": ("\nSCALE = float('nan')\n", "non-finite"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_models_fail_with_the_error_in_the_report(tmp_path: Path, case: str) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    line, message = BROKEN[case]
    model.write_text(model.read_text() + line)
    out = run_check(config)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL load+warm" in out.stdout and message in out.stdout
    assert "look at:" in out.stdout and "hotreload check: FAIL: mlp" in out.stdout


def test_a_misspelt_factory_name_gets_a_suggestion_and_no_traceback_hint(
    tmp_path: Path,
) -> None:
    config = make_project(tmp_path)
    # A file entry is checked before anything starts (a config error, exit 2)...
    config.write_text(config.read_text().replace('"model.py:build"', '"model.py:biuld"'))
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.py has no 'biuld'; did you mean 'build'?" in out.stderr
    # ...a module entry by the worker that imports it.
    config.write_text(config.read_text().replace('"model.py:biuld"', '"model:biuld"'))
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "has no attribute 'biuld'; did you mean 'build'?" in out.stdout
    # No traceback is printed for it, so the hint must not send the reader to one.
    assert "Traceback" not in out.stdout and "see the traceback" not in out.stdout
    assert "look at: the factory, the import of your code or the weights failed" in out.stdout


def test_an_example_returning_a_numpy_array_points_at_the_example(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    model.write_text(
        model.read_text() + "\n\ndef example_input():\n    import numpy as np\n\n"
        "    return np.zeros((1, IN_FEATURES), np.float32)\n"
    )
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    # The error names the callable and the fix; the hint points there, not at the factory.
    assert "model.py:example_input: the example callable must return a tensor" in out.stdout
    assert "it returned numpy ndarray (return torch.from_numpy(...) instead)" in out.stdout
    assert "look at: the example callable model.py:example_input failed" in out.stdout
    assert "the factory, the import of your code or the weights" not in out.stdout


def test_a_pickled_module_in_a_pt_file_says_to_save_the_state_dict(tmp_path: Path) -> None:
    import torch

    config = make_project(tmp_path)
    # The example's module pickled whole, here: saved under its own name, as its project
    # would (`import model; torch.save(model.build(), ...)`).
    model = import_file(config.parent / "model.py", "model")
    before = sys.modules.get("model")
    sys.modules["model"] = model
    try:
        torch.save(model.build(), config.parent / "weights.pt")
    finally:
        if before is None:
            del sys.modules["model"]
        else:
            sys.modules["model"] = before
    config.write_text(config.read_text().replace("weights.safetensors", "weights.pt"))
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "holds a pickled whole module (torch.save(model))" in out.stdout
    assert "save its weights instead: torch.save(model.state_dict()" in out.stdout
    # torch's own advice (allow-lists, weights_only=False) cannot be followed here.
    assert "weights_only" not in out.stdout and "add_safe_globals" not in out.stdout


def run_check_in_a_terminal(config: Path, *args: str, timeout: float = 120) -> str:
    """`hotreload check` with a pseudo-terminal as its output: what a user sees."""
    import pty
    import select

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hotreload", "check", "--config", str(config), *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=config.parent,
        env=dict(os.environ, NO_COLOR="1"),
    )
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout)
            assert ready, "no output from hotreload check within the timeout"
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout) == 0, b"".join(chunks).decode()
    finally:
        proc.kill()
        proc.wait(30)
        os.close(leader)
    return b"".join(chunks).decode()


def test_in_a_terminal_each_step_shows_as_it_starts_with_its_time(project: Path) -> None:
    out = run_check_in_a_terminal(project, "--reloads", "1")
    # The running step is drawn (and redrawn in place) before its result line.
    assert out.index("  ..   load+warm") < out.index("  ok   load+warm")
    assert out.index("  ok   load+warm") < out.index("  ..   reload 1") < out.index("ok   reload 1")
    # Redrawn in place with its elapsed time (the first figure depends on the machine).
    assert re.search(r"\r\033\[K  \.\.   load\+warm +\d+\.\d s", out), out
    assert "hotreload check: PASS" in out and out.count("ok   load+warm") == 1


def test_quick_mode_passes_and_a_changed_output_shape_fails_against_that_run(
    project: Path,
) -> None:
    out = run_check(project, "--reloads", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reload 1" not in out.stdout
    assert "ok   load+warm" in out.stdout and "hotreload check: PASS" in out.stdout
    model = project.parent / "model.py"
    model.write_text(
        model.read_text()
        + "\n_forward = MLP.forward\nMLP.forward = lambda self, x: _forward(self, x)[:, :5]\n"
    )
    out = run_check(project, "--reloads", "0")
    assert out.returncode == 1
    assert "output changed since the last passing check" in out.stdout
    assert "output float32[1, 10] -> output float32[1, 5]" in out.stdout


def test_expected_output_in_config_is_enforced(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    config.write_text(
        config.read_text().replace(
            'strategy = "inplace"',
            'strategy = "inplace"\nexpected_output = { shape = [-1, 12], dtype = "float32" }',
        )
    )
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 1 and "expected_output.shape is [-1, 12]" in out.stdout


LEAK = """
import torch

_fast_build = build


def build():
    # Each build keeps 40 MiB alive somewhere a reload never clears.
    torch._hotreload_test_leak = getattr(torch, "_hotreload_test_leak", [])
    torch._hotreload_test_leak.append(torch.ones(10 * 2**20))
    return _fast_build()
"""


def test_a_model_that_leaks_on_every_reload_fails_the_leak_check(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    model.write_text(model.read_text() + LEAK)
    out = run_check(config, "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    failed = next(s for s in doc["models"][0]["steps"] if not s["ok"])
    assert failed["name"].startswith("reload")
    assert "worker RSS grew by" in failed["detail"] and "64.0 MiB threshold" in failed["detail"]
    assert "module-level cache" in failed["hint"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reloads", "-1"], "--reloads must be 0 or more"),
        (["--model", "nope"], "no model named 'nope'"),
    ],
)
def test_bad_command_line_exits_2(project: Path, args: list[str], message: str) -> None:
    out = run_check(project, *args)
    assert out.returncode == 2 and message in out.stderr


def test_bad_config_exits_2(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text() + "\n[check]\nreload = 3\n")
    out = run_check(config)
    assert out.returncode == 2 and "did you mean 'reloads'?" in out.stderr


def test_missing_cuda_device_is_an_environment_error(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('device = "auto"', 'device = "cuda:0"'))
    out = run_check(config, "--reloads", "0")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "torch sees no CUDA device" in out.stdout


def test_pre_commit_hook_passes_then_fails_after_a_breaking_edit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(
        REPO / "examples" / "mlp", repo, ignore=shutil.ignore_patterns("__pycache__", ".hotreload")
    )
    # The first hook form docs/pre-commit.md shows (the local one, for everyone with a venv),
    # with this interpreter as "the project's own environment" and no reload, for speed (the
    # breaking edit fails the first build).
    page = (REPO / "docs" / "pre-commit.md").read_text()
    first = re.findall(r"```yaml\n(.*?)```", page, re.S)[0]
    assert "repo: local" in first, "the local hook comes first: it installs nothing"
    hook = first.replace(
        ".venv/bin/hotreload check", f"{sys.executable} -m hotreload check --reloads 0"
    )
    assert sys.executable in hook
    (repo / ".pre-commit-config.yaml").write_text(hook)
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pc-home"), GIT_AUTHOR_NAME="t")
    env.update(GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    precommit = [sys.executable, "-m", "pre_commit"]

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=180)

    assert run("git", "init", "-q").returncode == 0
    assert run(*precommit, "install").returncode == 0
    run("git", "add", "-A")
    good = run("git", "commit", "-qm", "add model")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "hotreload check" in good.stdout + good.stderr and "Passed" in good.stdout + good.stderr
    (repo / "model.py").write_text((repo / "model.py").read_text() + "\nSCALE = float('inf')\n")
    run("git", "add", "-A")
    bad = run("git", "commit", "-qm", "break it")
    assert bad.returncode != 0
    assert "Failed" in bad.stdout + bad.stderr and "non-finite" in bad.stdout + bad.stderr
    assert run("git", "log", "--oneline").stdout.count("\n") == 1, "the broken commit was refused"


def test_remote_hook_form_says_what_its_environment_costs() -> None:
    """pre-commit builds the remote form's environment with pip from PyPI: on Linux the CUDA
    torch. The page and the manifest say so, and how to get the CPU build instead."""
    page = (REPO / "docs" / "pre-commit.md").read_text()
    remote = page[page.index("**The hook from this repository**") :]
    assert "CUDA build: about 5.5 GB" in remote
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in remote
    assert "the CUDA build of torch (about 5.5 GB" in (REPO / ".pre-commit-hooks.yaml").read_text()


def test_hook_manifest_is_valid() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-manifest", ".pre-commit-hooks.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_shapes_declaration_that_does_not_fit_points_at_the_config(project: Path) -> None:
    """The worker's load error for `shapes` begins with SHAPES_REFUSED: the example ran fine,
    so the hint sends the user to the config, not to the example callable."""
    from hotreload.commands.check import _hint_for
    from hotreload.config import load_config
    from hotreload.protocol.messages import SHAPES_REFUSED

    model = load_config(project).model("mlp")
    error = f"{SHAPES_REFUSED}: shapes.input = [-1] has 1 dimension(s), but ..."
    hint = _hint_for("load", None, error, model)
    assert "the `shapes` table in mlp's config section does not fit" in hint, hint
    assert "example callable" not in hint
    # An error of the example callable itself still points there.
    error = "model.py:example_input: the example callable must return a tensor ..."
    assert "the example callable model.py:example_input failed" in _hint_for(
        "load", None, error, model
    )

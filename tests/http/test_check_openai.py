"""`hotreload check --openai`: the clients' minimal set (openai-python, Open WebUI's model
list, lm-eval's local-completions and local-chat-completions) run against examples/tiny_lm,
with and without its chat template, and without the eval extra installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.http.support_http import skip_unless_installed
from tests.support import REPO

# Each runs in the check's own processes (its worker, lm-eval's subprocess), not here.
skip_unless_installed("torch", "transformers")

CLIENT_STEPS = [
    "load+http",
    "completion",
    "chat",
    "chat stream",
    "models",
    "lm-eval local-completions",
    "lm-eval local-chat-completions",
]
CHAT_STEPS = {"chat", "chat stream", "lm-eval local-chat-completions"}


def tiny_lm(tmp_path: Path, chat_template: bool = True) -> Path:
    """A copy of examples/tiny_lm (its config path); without its CHAT_TEMPLATE on request."""
    root = tmp_path / "tiny_lm"
    shutil.copytree(REPO / "examples" / "tiny_lm", root)
    if not chat_template:
        model = root / "model.py"
        source = model.read_text()
        assert "\nCHAT_TEMPLATE = (" in source
        model.write_text(source.replace("\nCHAT_TEMPLATE = (", "\n_NO_TEMPLATE = ("))
    return root / "hotreload.toml"


def check_openai(
    config: Path, *args: str, prelude: str = "", timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`hotreload check --openai --json`; `prelude` runs first in the same process."""
    code = f"import sys\n{prelude}\nfrom hotreload.cli import main\nsys.exit(main(sys.argv[1:]))"
    argv = ["check", "--openai", "--json", "--config", str(config), *args]
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
    )


def steps_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc = json.loads(done.stdout)
    (model,) = doc["models"]
    return {s["name"]: s for s in model["steps"]}


@pytest.mark.timeout(300)
def test_every_client_passes_on_the_tiny_lm(tmp_path: Path) -> None:
    skip_unless_installed("openai", "lm_eval")
    done = check_openai(tiny_lm(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    steps = steps_of(done)
    assert list(steps) == CLIENT_STEPS
    assert all(s["ok"] for s in steps.values()), steps
    # The streamed deltas add up to the non-streamed greedy answer, and that is not empty.
    chat = steps["chat"]["figures"]["content"]
    assert chat and steps["chat stream"]["figures"]["content"] == chat
    assert steps["models"]["figures"]["ids"] == ["gen"]
    # lm-eval scored each bundled task, through the client each stands for.
    assert steps["lm-eval local-completions"]["figures"]["task"] == "hr_check_mc"
    assert "acc,none" in steps["lm-eval local-completions"]["figures"]["metrics"]
    gen = steps["lm-eval local-chat-completions"]["figures"]
    assert gen["task"] == "hr_check_gen" and "exact_match,none" in gen["metrics"]


@pytest.mark.timeout(300)
def test_without_a_chat_template_the_chat_clients_fail_naming_it(tmp_path: Path) -> None:
    skip_unless_installed("openai", "lm_eval")
    done = check_openai(tiny_lm(tmp_path, chat_template=False))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    steps = steps_of(done)
    assert list(steps) == CLIENT_STEPS
    for name, step in steps.items():
        assert step["ok"] == (name not in CHAT_STEPS), (name, step)
    for name in CHAT_STEPS:
        # The server's own 400 message: which client breaks, and why.
        assert "HTTP 400" in steps[name]["detail"], steps[name]
        assert "has no chat template" in steps[name]["detail"], steps[name]
        assert "CHAT_TEMPLATE" in steps[name]["hint"] or name.startswith("lm-eval")


@pytest.mark.timeout(300)
def test_without_the_eval_extra_it_says_what_to_install(tmp_path: Path) -> None:
    # Neither importable in that process: as on an install without the `eval` extra.
    blocked = "sys.modules['openai'] = None\nsys.modules['lm_eval'] = None"
    done = check_openai(tiny_lm(tmp_path), prelude=blocked)
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    steps = steps_of(done)
    assert list(steps) == ["load+http", "openai-python", "models", "lm-eval"]
    for name in ("openai-python", "lm-eval"):
        assert not steps[name]["ok"] and "is not installed" in steps[name]["detail"]
        assert "pip install 'hotreload[eval]'" in steps[name]["hint"]
    assert steps["models"]["ok"]


def test_bad_command_lines_and_configs_say_what_to_fix(tmp_path: Path) -> None:
    config = tiny_lm(tmp_path)
    done = check_openai(config, "--reloads", "2")
    assert done.returncode == 2 and "--openai runs the client steps only" in done.stderr
    source = config.read_text()
    assert "\ngenerator = true\n" in source
    config.write_text(source.replace("\ngenerator = true\n", "\n"))
    done = check_openai(config)
    assert done.returncode == 2
    assert "no model in the config is a text generator" in done.stderr

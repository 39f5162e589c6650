"""`hotreload check --openai`: the clients' minimal set (openai-python, Open WebUI's model
list, lm-eval's local-completions and local-chat-completions) run against examples/tiny_lm,
with and without its chat template, and without the eval extra installed; `--clients`
choosing some of them."""

from __future__ import annotations

import asyncio
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
    """Every client but lm-eval's local-completions, named out of order: their steps run in
    the check's order (lm-eval has nothing to run: the server refused the chat before).
    (lm-eval's local-completions on a model with no chat template: tests/http/
    test_eval_harness.py's "lm"; the check's report of it passing beside a refused chat:
    test_chosen_clients_against_served_models.)"""
    skip_unless_installed("openai", "lm_eval")
    clients = "lm-eval-chat,models,chat-stream,chat,completion"
    done = check_openai(tiny_lm(tmp_path, chat_template=False), "--clients", clients)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    steps = steps_of(done)
    assert list(steps) == [s for s in CLIENT_STEPS if s != "lm-eval local-completions"]
    for name, step in steps.items():
        assert step["ok"] == (name not in CHAT_STEPS), (name, step)
    for name in CHAT_STEPS:
        # The server's own 400 message: which client breaks, and why.
        assert "HTTP 400" in steps[name]["detail"], steps[name]
        assert "has no chat template" in steps[name]["detail"], steps[name]
        assert "CHAT_TEMPLATE" in steps[name]["hint"], steps[name]


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


def test_clients_choose_the_steps_and_the_extras_they_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, no server (nothing answers on its URL): which steps a choice of clients
    runs, which extra it asks for, and what lm-eval is given to run."""
    from hotreload.commands.check_openai import CLIENTS, OpenAICheck, lm_eval_runs, parse_clients
    from hotreload.config import load_config

    config = load_config(tiny_lm(tmp_path))

    def steps(clients: str) -> list[str]:
        check = OpenAICheck(config, config.models[0], None, parse_clients(clients))
        check.url = "http://127.0.0.1:9"  # the discard port: refused at once
        asyncio.run(asyncio.wait_for(check._clients(), 60))
        return [step.name for step in check.report.steps]

    # Neither extra importable: only the steps chosen, and only the extras they need.
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    assert steps("models") == ["models"]
    assert steps("models,chat-stream") == ["openai-python", "models"]
    assert steps("lm-eval-chat") == ["lm-eval"]
    assert parse_clients(None) == frozenset(CLIENTS) == parse_clients(",".join(CLIENTS))

    def labels(clients: str, refusal: str | None) -> list[str]:
        runs = lm_eval_runs("gen", "http://h", parse_clients(clients), refusal)
        return [run["label"] for run in runs]

    every = ",".join(CLIENTS)
    assert labels(every, None) == ["local-completions", "local-chat-completions"]
    # A chat the server refused: local-completions still runs, the chat client does not.
    assert labels(every, "HTTP 400: no chat template") == ["local-completions"]
    assert labels("lm-eval-chat", "HTTP 400: no chat template") == []
    assert labels("lm-eval-chat,completion", None) == ["local-chat-completions"]


@pytest.mark.timeout(300)
def test_chosen_clients_against_served_models(
    lm_server: Any, chat_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, against the sessions tests/http/conftest.py shares: "gen" (examples/
    tiny_lm, with its chat template) and "lm" (no chat template). A client chosen alone runs
    alone and does all its step's work; lm-eval's chat client learns a refused chat from the
    step that met it, else from one request of its own, and fails in the server's words
    without running, beside a local-completions run that passes. lm-eval itself is replaced
    by a recorder (it runs for real in the tests above): what matters here is what it is
    given to run and how its results are reported."""
    skip_unless_installed("openai", "lm_eval")
    from hotreload.commands.check_openai import OpenAICheck, parse_clients
    from hotreload.config import load_config

    given: list[list[str]] = []
    asked: list[str] = []

    async def lm_eval(self: OpenAICheck, runs: list[dict[str, Any]]) -> dict[str, Any]:
        given.append([run["label"] for run in runs])
        scores = {"hr_check_mc": {"acc,none": 0.5}}
        return {"local-completions": {"label": "local-completions", "metrics": scores}}

    ask_chat = OpenAICheck._ask_chat

    async def counted(self: OpenAICheck) -> None:
        asked.append(self.model.name)
        await ask_chat(self)

    monkeypatch.setattr(OpenAICheck, "_run_lm_eval", lm_eval)
    monkeypatch.setattr(OpenAICheck, "_ask_chat", counted)

    def check(server: Any, name: str, clients: str) -> dict[str, Any]:
        config = load_config(server.config)
        run = OpenAICheck(config, config.model(name), None, parse_clients(clients))
        run.url = server.url
        asyncio.run(asyncio.wait_for(run._clients(), 120))
        return {step.name: step for step in run.report.steps}

    # The stream step alone: it compares its deltas with a non-streamed answer of its own.
    steps = check(chat_server, "gen", "chat-stream")
    assert list(steps) == ["chat stream"] and steps["chat stream"].ok, steps
    figures = steps["chat stream"].figures
    assert figures["plain"] and figures["plain"] == figures["content"], figures
    assert list(check(chat_server, "gen", "completion")) == ["completion"]
    # ...and fails when they differ (that answer replaced: the server's agree).
    with monkeypatch.context() as patch:

        async def other(self: OpenAICheck) -> str:
            return "not what was streamed"

        patch.setattr(OpenAICheck, "_answer", other)
        (stream,) = check(chat_server, "gen", "chat-stream").values()
    assert not stream.ok and "differ from the non-streamed greedy answer" in stream.detail
    assert "'not what was streamed' at temperature 0" in stream.detail, stream.detail

    def refused(step: Any) -> None:
        assert not step.ok, step
        assert "HTTP 400" in step.detail and "has no chat template" in step.detail, step
        assert "CHAT_TEMPLATE" in step.hint, step

    # The stream step met the refusal: lm-eval's chat client says it, nothing more is sent.
    steps = check(lm_server, "lm", "lm-eval-chat,chat-stream")
    assert list(steps) == ["chat stream", "lm-eval local-chat-completions"], steps
    for step in steps.values():
        refused(step)
    assert "the server refuses chat" in steps["lm-eval local-chat-completions"].detail
    assert given == [] and asked == []
    # No chat step: one request learns the refusal; local-completions alone runs, and passes.
    steps = check(lm_server, "lm", "lm-eval-chat,lm-eval-completions")
    assert list(steps) == ["lm-eval local-completions", "lm-eval local-chat-completions"]
    assert given == [["local-completions"]] and asked == ["lm"]
    assert steps["lm-eval local-completions"].ok, steps
    assert steps["lm-eval local-completions"].detail == "hr_check_mc acc 0.5"
    refused(steps["lm-eval local-chat-completions"])


def test_bad_command_lines_and_configs_say_what_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process: each is refused before any worker starts."""
    from hotreload.cli import main

    def refused(*args: str) -> str:
        assert main(["check", *args]) == 2, args
        return capsys.readouterr().err

    config = tiny_lm(tmp_path)
    args = ["--config", str(config)]
    assert "--openai runs the client steps only" in refused("--openai", *args, "--reloads", "2")
    known = "completion, chat, chat-stream, models, lm-eval-completions, lm-eval-chat"
    for clients, said in (
        ("chat,lm-eval", f"unknown client(s) 'lm-eval'; choose among {known} (comma-separated)"),
        ("chats, Models", "unknown client(s) 'chats', 'Models'"),
        (" , ", f"--clients names no client; give one or more of {known}"),
        ("", "--clients names no client"),
    ):
        err = refused("--openai", *args, "--clients", clients)
        assert "hotreload check --openai: --clients" in err and said in err, (clients, err)
    err = refused(*args, "--clients", "chat")
    assert "--clients chooses among the --openai clients; add --openai, or drop --clients" in err
    source = config.read_text()
    assert "\ngenerator = true\n" in source
    config.write_text(source.replace("\ngenerator = true\n", "\n"))
    assert "no model in the config is a text generator" in refused("--openai", *args)

"""`hotreload check --openai`: the OpenAI-compatible clients' minimal set against a model.

For each generator (or the `--model` named), in a fresh worker: start the session's HTTP
server on a free loopback port, then run what real clients send and say which would break
and why: openai-python's completion, chat and streamed chat (the deltas must add up to the
non-streamed greedy answer, with one usage chunk last); `/v1/models` as Open WebUI reads
it; lm-eval's `local-completions` (loglikelihood) and `local-chat-completions`
(generation) on the tiny tasks bundled in `openai_tasks/`. openai is imported here, lazily,
and lm-eval only in a subprocess: the engine imports neither. `--clients` runs some of them
(a model with no chat template has no use for the chat ones); a chat the server refuses
(whichever step met it, or one request made to learn it) fails lm-eval's chat client with
the server's reason instead of running it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from hotreload.commands.check_progress import LiveProgress
from hotreload.commands.check_results import (
    ModelReport,
    Step,
    run_checks,
)
from hotreload.config import Config, ModelConfig, load_config
from hotreload.engine.events import EventBus
from hotreload.engine.model import PhaseFailed
from hotreload.engine.session import Session
from hotreload.errors import ConfigError, HotreloadError
from hotreload.exitcodes import (
    EXIT_ENVIRONMENT,
    EXIT_USAGE,
    error_exit,
    exit_code_for,
)
from hotreload.preflight import preflight

TASKS = Path(__file__).resolve().parent / "openai_tasks"
INSTALL_HINT = "pip install 'hotreload[eval]'"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "The opposite of hot is"}]
MAX_TOKENS = 8
#: lm-eval imports slowly (torch, datasets); a server that never answers must not hang it.
LMEVAL_TIMEOUT_S = 600.0
CLIENT_TIMEOUT_S = 120.0
#: `--clients` names, in the order their steps run; the step each runs.
CLIENTS = {
    "completion": "completion",
    "chat": "chat",
    "chat-stream": "chat stream",
    "models": "models",
    "lm-eval-completions": "lm-eval local-completions",
    "lm-eval-chat": "lm-eval local-chat-completions",
}
OPENAI_CLIENTS = ("completion", "chat", "chat-stream")
#: lm-eval's model type for each of its clients, the `--clients` name it goes by.
LM_EVAL_CLIENTS = {
    "lm-eval-completions": "local-completions",
    "lm-eval-chat": "local-chat-completions",
}


class ClientsError(ValueError):
    """A `--clients` value that names no known client (the message says which are)."""


def parse_clients(text: str | None) -> frozenset[str]:
    """`--clients a,b`: the names chosen (every client when not given)."""
    if text is None:
        return frozenset(CLIENTS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = ", ".join(CLIENTS)
    if not names:
        raise ClientsError(f"--clients names no client; give one or more of {known}")
    unknown = [n for n in names if n not in CLIENTS]
    if unknown:
        raise ClientsError(
            f"--clients: unknown client(s) {', '.join(map(repr, unknown))}; "
            f"choose among {known} (comma-separated)"
        )
    return frozenset(names)


class StepFailed(Exception):
    """A client step's failure: the reason a client would break, and what to look at."""

    def __init__(self, reason: str, hint: str | None = None, tb: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.hint, self.tb = reason, hint, tb


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: blocked, as good as absent
        return False


def _fix_for(reason: str) -> str:
    """What to look at for a server's refusal; a missing chat template is the common one."""
    if "chat template" in reason:
        return "give the tokenizer a chat_template (or CHAT_TEMPLATE in the model's module)"
    return "the server's answer above says what to fix in the model or its config"


def _server_reason(exc: Exception) -> str:
    """The server's own words for an SDK error (its JSON `message`), else the error."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status_code", None)
    if isinstance(body, dict) and body.get("message"):
        return f"HTTP {status}: {body['message']}"
    return f"{type(exc).__name__}: {exc}"


def _error_message(body: bytes) -> str | None:
    """The message of an error reply: `{"error": {"message": ...}}` on the OpenAI routes."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) and error else None


def lm_eval_runs(
    model: str, url: str, clients: frozenset[str], chat_refusal: str | None
) -> list[dict[str, Any]]:
    """What lm-eval runs, in one subprocess, for the chosen lm-eval clients; not the chat
    client where the server already refused a chat (that step says so instead)."""
    runs: list[dict[str, Any]] = []
    if "lm-eval-completions" in clients:
        runs.append(
            {
                "label": "local-completions",
                "model": "local-completions",
                "model_args": {
                    "model": model,
                    "base_url": f"{url}/v1/completions",
                    "tokenizer_backend": "remote",
                    "max_retries": 1,
                },
                "tasks": ["hr_check_mc"],
            }
        )
    if "lm-eval-chat" in clients and chat_refusal is None:
        runs.append(
            {
                "label": "local-chat-completions",
                "model": "local-chat-completions",
                "model_args": {
                    "model": model,
                    "base_url": f"{url}/v1/chat/completions",
                    "max_retries": 1,
                },
                "tasks": ["hr_check_gen"],
                "apply_chat_template": True,
            }
        )
    return runs


class OpenAICheck:
    def __init__(
        self,
        config: Config,
        model: ModelConfig,
        progress: LiveProgress | None,
        clients: frozenset[str] = frozenset(CLIENTS),
    ) -> None:
        # Loopback, a free port: the check never collides with a running `serve --http`.
        self.config = replace(config, models=(model,))
        self.model = model
        self.clients = clients
        self.progress = progress
        self.report = ModelReport(model.name, policy=model.policy, strategy=model.strategy)
        self.url = ""
        #: The non-streamed greedy chat answer, which the streamed deltas must equal.
        self.chat_answer: str | None = None
        #: The server's reason for refusing a chat: lm-eval's chat run would meet it too.
        self.chat_refusal: str | None = None
        #: Whether a chat request got an answer or a refusal (then lm-eval's chat client
        #: needs no request of its own to learn whether the server refuses chat).
        self.chat_asked = False

    async def step(
        self, name: str, body: Callable[[], Awaitable[tuple[str, dict[str, Any]]]]
    ) -> bool:
        t0 = time.monotonic()
        if self.progress is not None:
            self.progress.started(name)
        try:
            detail, figures = await body()
            step = Step(name, True, time.monotonic() - t0, detail, figures)
        except StepFailed as exc:
            step = Step(name, False, time.monotonic() - t0, exc.reason, {}, exc.hint, exc.tb)
        self.report.steps.append(step)
        if self.progress is not None:
            self.progress.finished(step)
        return step.ok

    async def run(self) -> ModelReport:
        session = Session(self.config, events=EventBus(None), endpoint=False)
        endpoint = None
        if self.progress is not None:
            self.progress.model(self.model.name, self.model.policy, self.model.strategy)

        async def start() -> tuple[str, dict[str, Any]]:
            nonlocal endpoint
            try:
                await session.start()
            except PhaseFailed as exc:
                if exit_code_for(exc) == EXIT_ENVIRONMENT:
                    self.report.environment_error = str(exc)
                raise StepFailed(
                    f"{exc.phase} failed: {exc}",
                    "run `hotreload check` without --openai for the model's own checks",
                    exc.remote_traceback,
                ) from None
            # Imported here: aiohttp and the HTTP layer load only when a server is needed.
            from hotreload.http import start_http

            try:
                endpoint = await start_http(session, "127.0.0.1", 0)
            except HotreloadError as exc:
                raise StepFailed(str(exc)) from None
            self.url = endpoint.url
            self.report.device = session.models[self.model.name].view.device or ""
            return f"serving on {self.url}", {"url": self.url}

        try:
            if await self.step("load+http", start):
                await self._clients()
        finally:
            if endpoint is not None:
                await endpoint.close()
            await session.stop()
        return self.report

    async def _clients(self) -> None:
        chosen = self.clients
        if chosen & set(OPENAI_CLIENTS):
            if not _installed("openai"):
                self._missing("openai-python", "openai")
            else:
                bodies = {"completion": self._completion, "chat": self._chat,
                          "chat-stream": self._stream}  # fmt: skip
                for client in OPENAI_CLIENTS:
                    if client in chosen:
                        await self.step(CLIENTS[client], bodies[client])
        if "models" in chosen:
            await self.step("models", self._models)
        if chosen & set(LM_EVAL_CLIENTS):
            if not _installed("lm_eval"):
                self._missing("lm-eval", "lm_eval")
            else:
                await self._lm_eval()

    def _missing(self, client: str, module: str) -> None:
        reason = f"{client} is not installed (no module {module!r}): its steps cannot run"
        self.report.environment_error = reason
        step = Step(client, False, 0.0, reason, {}, f"install the eval extra: {INSTALL_HINT}")
        self.report.steps.append(step)
        if self.progress is not None:
            self.progress.finished(step)

    def _client(self) -> Any:
        import openai

        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )

    async def _call(self, what: str, fn: Callable[[], Any], chat: bool = False) -> Any:
        """The SDK is blocking and the server runs on this loop: call it in a thread. A
        `chat` request the server refuses records why: lm-eval's chat client would meet it."""
        import openai

        try:
            done = await asyncio.to_thread(fn)
        except openai.APIStatusError as exc:
            reason = _server_reason(exc)
            if chat:
                self.chat_refusal, self.chat_asked = reason, True
            raise StepFailed(
                f"openai-python {what} would break: {reason}", _fix_for(reason)
            ) from None
        except openai.OpenAIError as exc:
            raise StepFailed(f"openai-python {what} would break: {_server_reason(exc)}") from None
        self.chat_asked = self.chat_asked or chat
        return done

    async def _completion(self) -> tuple[str, dict[str, Any]]:
        client = self._client()
        done = await self._call(
            "completions.create",
            lambda: client.completions.create(
                model=self.model.name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
            ),
        )
        if not done.choices or not isinstance(done.choices[0].text, str):
            raise StepFailed("openai-python completions.create: the reply has no choices[0].text")
        if done.usage is None:
            raise StepFailed("openai-python completions.create: the reply has no usage")
        text = done.choices[0].text
        return f"{text!r} ({done.usage.completion_tokens} tokens)", {"text": text}

    async def _answer(self) -> str:
        """The non-streamed greedy chat answer (the chat step's, and the one the stream step
        compares with when `chat` is not chosen)."""
        client = self._client()
        done = await self._call(
            "chat.completions.create",
            lambda: client.chat.completions.create(
                model=self.model.name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
            ),
            chat=True,
        )
        message = done.choices[0].message if done.choices else None
        if message is None or message.role != "assistant" or message.content is None:
            raise StepFailed("openai-python chat: choices[0].message is not an assistant's text")
        return str(message.content)

    async def _chat(self) -> tuple[str, dict[str, Any]]:
        self.chat_answer = await self._answer()
        return f"{self.chat_answer!r}", {"content": self.chat_answer}

    async def _stream(self) -> tuple[str, dict[str, Any]]:
        client = self._client()

        def collect() -> list[Any]:
            stream = client.chat.completions.create(
                model=self.model.name,
                messages=CHAT,
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            return list(stream)

        chunks = await self._call("chat.completions.create(stream=True)", collect, chat=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = [i for i, c in enumerate(chunks) if c.usage is not None]
        if len(usage) != 1:
            raise StepFailed(
                f"stream_options.include_usage: {len(usage)} chunks carry usage, expected "
                "exactly 1 (clients count tokens from it)"
            )
        last = chunks[usage[0]]
        if last.choices or usage[0] != len(chunks) - 1:
            raise StepFailed(
                "the usage chunk must be the last before [DONE], with choices: [] "
                f"(it is chunk {usage[0] + 1} of {len(chunks)}, {len(last.choices)} choices)"
            )
        # The comparison is the point of the step: without the chat step's answer to compare
        # with, it asks for one itself. (A chosen chat step that failed has said why.)
        plain = self.chat_answer if "chat" in self.clients else await self._answer()
        if plain is not None and text != plain:
            raise StepFailed(
                f"the streamed deltas {text!r} differ from the non-streamed greedy answer "
                f"{plain!r} at temperature 0",
                "a streaming client would show another answer than a plain one",
            )
        same = " = the non-streamed answer" if plain is not None else ""
        return (
            f"{len(chunks)} chunks = {text!r}{same}; usage last "
            f"({last.usage.completion_tokens} tokens)",
            {"chunks": len(chunks), "content": text, "plain": plain},
        )

    async def _models(self) -> tuple[str, dict[str, Any]]:
        def get() -> Any:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=CLIENT_TIMEOUT_S) as r:
                return json.loads(r.read())

        try:
            doc = await asyncio.to_thread(get)
        except (OSError, ValueError) as exc:
            raise StepFailed(f"GET /v1/models failed: {exc}") from None
        entries = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise StepFailed("GET /v1/models: no data[] list, so Open WebUI lists no model")
        for entry in entries:
            bad = [
                f"{key} ({want})"
                for key, want, ok in (
                    ("id", "a string", isinstance(entry.get("id"), str)),
                    ("object", '"model"', entry.get("object") == "model"),
                    ("created", "an int", type(entry.get("created")) is int),
                    ("owned_by", "a string", isinstance(entry.get("owned_by"), str)),
                )
                if not ok
            ]
            if bad:
                raise StepFailed(
                    f"GET /v1/models: entry {entry.get('id')!r} lacks {', '.join(bad)}: "
                    "Open WebUI would not list it"
                )
        ids = [e["id"] for e in entries]
        if self.model.name not in ids:
            raise StepFailed(f"GET /v1/models lists {ids}, not {self.model.name!r}")
        return f"{len(ids)} model(s): {', '.join(ids)}", {"ids": ids}

    async def _ask_chat(self) -> None:
        """One chat request, for lm-eval's chat client when no chat step has asked: a refusal
        (a model with no chat template) is then reported in the server's words, with what to
        fix, rather than as lm-eval's HTTPError traceback. Plain HTTP: lm-eval needs no
        openai-python."""
        body = {"model": self.model.name, "messages": CHAT, "max_tokens": 1, "temperature": 0}
        request = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )

        def post() -> None:
            with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as reply:
                reply.read()

        try:
            await asyncio.to_thread(post)
        except urllib.error.HTTPError as exc:
            self.chat_refusal = f"HTTP {exc.code}: {_error_message(exc.read()) or exc.reason}"
        except OSError:
            return  # no answer at all: lm-eval meets it too and says so
        self.chat_asked = True

    async def _lm_eval(self) -> None:
        """The chosen lm-eval clients in one subprocess (lm-eval imports once); none at all
        when the only one chosen is the chat client and the server refuses chat."""
        if "lm-eval-chat" in self.clients and not self.chat_asked:
            await self._ask_chat()
        runs = lm_eval_runs(self.model.name, self.url, self.clients, self.chat_refusal)
        t0 = time.monotonic()
        try:
            results, failure = (await self._run_lm_eval(runs) if runs else {}), None
        except StepFailed as exc:
            results, failure = {}, exc
        seconds = time.monotonic() - t0
        for client, metric in (
            ("lm-eval-completions", "acc,none"),
            ("lm-eval-chat", "exact_match,none"),
        ):
            if client not in self.clients:
                continue
            label = LM_EVAL_CLIENTS[client]
            name = f"lm-eval {label}"
            got = results.get(label)
            if label == "local-chat-completions" and self.chat_refusal is not None:
                step = Step(
                    name,
                    False,
                    0.0,
                    f"lm-eval {label} would break: the server refuses chat ({self.chat_refusal})",
                    {},
                    _fix_for(self.chat_refusal),
                )
            elif failure is not None:
                step = Step(name, False, seconds, failure.reason, {}, failure.hint, failure.tb)
            elif got is None or "error" in got:
                error = got["error"] if got else "no result"
                step = Step(
                    name,
                    False,
                    seconds,
                    f"lm-eval {label} would break: {error}",
                    {},
                    "lm-eval's traceback below",
                    got.get("traceback") if got else None,
                )
            else:
                task, scores = next(iter(got["metrics"].items()))
                value = scores.get(metric)
                shared = " (one lm-eval run for both clients)" if len(runs) > 1 else ""
                step = Step(
                    name,
                    True,
                    seconds,
                    f"{task} {metric.split(',')[0]} {value}{shared}",
                    {"task": task, "metrics": scores},
                )
            self.report.steps.append(step)
            if self.progress is not None:
                self.progress.finished(step)

    async def _run_lm_eval(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.progress is not None:
            self.progress.started("lm-eval")
        with tempfile.TemporaryDirectory(prefix="hotreload-lmeval-") as tmp:
            spec, out = Path(tmp) / "runs.json", Path(tmp) / "results.json"
            spec.write_text(json.dumps(runs))
            env = dict(
                os.environ,
                # Offline, with caches of its own: the bundled tasks need no download.
                HF_HUB_OFFLINE="1",
                HF_DATASETS_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1",
                HF_HOME=str(Path(tmp) / "hf_home"),
                TOKENIZERS_PARALLELISM="false",
                OPENAI_API_KEY="unused",
                PYTHONWARNINGS="ignore",
            )
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(TASKS / "run_lmeval.py"),
                str(spec),
                str(out),
                cwd=TASKS,  # the task YAMLs name their data relative to this folder
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                _, stderr = await asyncio.wait_for(proc.communicate(), LMEVAL_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise StepFailed(
                    f"lm-eval did not finish in {LMEVAL_TIMEOUT_S:.0f} s",
                    "a request may hang: try the openai steps' requests by hand",
                ) from None
            if proc.returncode != 0 or not out.exists():
                tail = stderr.decode(errors="replace").strip().splitlines()[-12:]
                raise StepFailed(
                    f"lm-eval exited with {proc.returncode}", "its output below", "\n".join(tail)
                )
            return {r["label"]: r for r in json.loads(out.read_text())}


async def _check(
    config: Config,
    models: list[ModelConfig],
    clients: frozenset[str],
    progress: LiveProgress | None,
) -> list[ModelReport]:
    return [await OpenAICheck(config, m, progress, clients).run() for m in models]


def check_openai_main(
    config_path: str | None, *, model: str | None, as_json: bool, clients: str | None = None
) -> int:
    try:
        chosen = parse_clients(clients)
    except ClientsError as exc:
        print(f"hotreload check --openai: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config(config_path)
        if model:
            models = [config.model(model)]
        else:
            models = [m for m in config.models if m.generator]
            if not models:
                print(
                    "hotreload check --openai: no model in the config is a text generator; "
                    "set `generator = true` on one, or name one with --model",
                    file=sys.stderr,
                )
                return EXIT_USAGE
        preflight(config, models)
    except ConfigError as exc:
        return error_exit("hotreload check", exc)
    return run_checks(partial(_check, config, models, chosen), as_json, config.path)

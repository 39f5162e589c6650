"""Clients nobody here wrote, against `/v1/chat/completions`: the `openai` SDK (a chat, and
the reason its BadRequestError prints), LiteLLM's OpenAI-compatible provider, and
lm-evaluation-harness's `local-chat-completions` on a generation task, scored exactly as
lm-eval's `hf` model scores the same folder in-process with the same chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.chat_lm import chat_project, greedy, in_process
from tests.http.conftest import HttpServeProcess
from tests.http.test_eval_harness import offline_env
from tests.support import REPO, SHARED

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CHAT = [{"role": "user", "content": "The opposite of hot is"}]


class Server(HttpServeProcess):
    root: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = chat_project(tmp_path_factory.mktemp("clients") / "proj")
    server = Server(config)
    SHARED.add(server.proc.pid)
    try:
        server.wait_ready(180)
        server.root = config.parent
        yield server
    finally:
        SHARED.discard(server.proc.pid)
        server.close()


def expected_answer(root: Path, tokens: int) -> str:
    """The in-process greedy answer to CHAT: the template's text, no special tokens added."""
    model, tok = in_process(root, "chat")
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False).input_ids
    made = greedy(lambda x: model(input_ids=x).logits, ids, tokens, tok.eos_token_id)
    return str(tok.decode([t for t in made if t != tok.eos_token_id]))


def test_the_openai_sdk_chats_and_prints_the_reason_of_a_400(server: Server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    done = client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_answer(server.root, 6)
    assert choice.logprobs is not None and len(choice.logprobs.content) == 6
    assert done.system_fingerprint.startswith("sha256:") and done.usage.completion_tokens == 6
    assert (done.model_extra or {}).get("model_version") == 1
    several = client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=4, n=3, seed=2, temperature=1.0
    )
    assert [c.index for c in several.choices] == [0, 1, 2]

    # The SDK's exception says what to fix: the message of the error object, and its field.
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="chat", messages=CHAT, n=500)
    assert "'n' must be an integer from 1 to 128, got 500" in str(err.value)
    assert (err.value.param, err.value.type) == ("n", "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="lm", messages=CHAT)
    assert "has no chat template" in str(err.value)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=CHAT)
    assert "unknown model 'nope'" in str(missing.value)


LITELLM_CALL = """
import json, sys
import litellm

url, messages = sys.argv[1], json.loads(sys.argv[2])
done = litellm.completion(
    model="openai/chat", api_base=url + "/v1", api_key="unused", messages=messages,
    max_tokens=6, temperature=0,
)
print(json.dumps({
    "content": done.choices[0].message.content,
    "finish_reason": done.choices[0].finish_reason,
    "completion_tokens": done.usage.completion_tokens,
}))
"""


def test_litellm_chats_through_its_openai_compatible_provider(server: Server) -> None:
    pytest.importorskip("litellm")
    env = dict(
        os.environ,
        # Its price list from the package, not GitHub: no network here.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY="False",
        PYTHONWARNINGS="ignore",
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LITELLM_CALL), server.url, json.dumps(CHAT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["content"] == expected_answer(server.root, 6)
    assert got["completion_tokens"] == 6 and got["finish_reason"] == "length"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lm_eval_local_chat_completions_scores_as_hf_in_process(
    server: Server, tmp_path: Path
) -> None:
    pytest.importorskip("lm_eval")
    folder = server.root / "chat_lm"
    runs = [
        {
            "label": "hf",
            "model": "hf",
            "model_args": {"pretrained": str(folder), "dtype": "float32", "device": "cpu"},
            "apply_chat_template": True,
        },
        {
            "label": "served, local-chat-completions",
            "model": "local-chat-completions",
            "model_args": {
                "model": "chat",
                "base_url": f"{server.url}/v1/chat/completions",
                "max_retries": 1,
            },
            "apply_chat_template": True,
        },
    ]
    spec, out = tmp_path / "runs.json", tmp_path / "results.json"
    spec.write_text(json.dumps(runs))
    env = offline_env(tmp_path)
    env["HR_LMEVAL_TASKS"] = json.dumps(["hr_tiny_gen"])  # generation only: chat has no scores
    done = subprocess.run(
        [sys.executable, "-m", "tests.evalharness.run_lmeval", str(spec), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ref, got = json.loads(out.read_text())
    rows, ref_rows = got["samples"]["hr_tiny_gen"], ref["samples"]["hr_tiny_gen"]
    assert len(ref_rows) == 6 and any(r["resps"][0][0] for r in ref_rows), "no text generated"
    # Every generation, exactly, and so every metric.
    assert [r["resps"] for r in rows] == [r["resps"] for r in ref_rows]
    assert got["metrics"] == ref["metrics"]

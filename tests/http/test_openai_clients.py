"""Clients nobody here wrote, against `/v1/chat/completions`: the `openai` SDK (a chat, and
the reason its BadRequestError prints) and LiteLLM's OpenAI-compatible provider (a chat, and
the same chat streamed with its usage chunk), each answer the in-process greedy one.
lm-evaluation-harness's `local-chat-completions` on the same session, scored exactly as
lm-eval's `hf` model scores the same folder in-process with the same chat template, is in
tests/http/test_eval_harness.py (one lm-eval run for it and `local-completions`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.http.chat_lm import greedy, in_process
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import skip_unless_installed

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CHAT = [{"role": "user", "content": "The opposite of hot is"}]


@pytest.fixture(scope="module")
def server(chat_server: HttpServeProcess) -> HttpServeProcess:
    """The shared session of tests/http/conftest.py: "chat", "lm" and "gen"."""
    return chat_server


def expected_answer(root: Path, tokens: int) -> str:
    """The in-process greedy answer to CHAT: the template's text, no special tokens added."""
    model, tok = in_process(root, "chat")
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False).input_ids
    made = greedy(lambda x: model(input_ids=x).logits, ids, tokens, tok.eos_token_id)
    return str(tok.decode([t for t in made if t != tok.eos_token_id]))


def test_the_openai_sdk_chats_and_prints_the_reason_of_a_400(server: HttpServeProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    done = client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_answer(server.config.parent, 6)
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


LITELLM_CALLS = """
import json, sys
import litellm

url, messages = sys.argv[1], json.loads(sys.argv[2])
ask = dict(
    model="openai/chat", api_base=url + "/v1", api_key="unused", messages=messages,
    max_tokens=6, temperature=0,
)
done = litellm.completion(**ask)
# Streamed: LiteLLM fails on a usage chunk of another shape than OpenAI's.
chunks = list(litellm.completion(**ask, stream=True, stream_options={"include_usage": True}))
usage = [c.usage for c in chunks if getattr(c, "usage", None)]
print(json.dumps({
    "content": done.choices[0].message.content,
    "finish_reason": done.choices[0].finish_reason,
    "completion_tokens": done.usage.completion_tokens,
    "stream": {
        "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
        "completion_tokens": usage[-1].completion_tokens if usage else None,
    },
}))
"""


def test_litellm_chats_and_streams_through_its_openai_compatible_provider(
    server: HttpServeProcess,
) -> None:
    """One LiteLLM process (its import costs seconds) for a chat and the same chat
    streamed: both the in-process greedy answer, and the stream's usage chunk read."""
    skip_unless_installed("litellm")  # imported in the subprocess only
    env = dict(
        os.environ,
        # Its price list from the package, not GitHub: no network here.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY="False",
        PYTHONWARNINGS="ignore",
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LITELLM_CALLS), server.url, json.dumps(CHAT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["content"] == expected_answer(server.config.parent, 6)
    assert got["completion_tokens"] == 6 and got["finish_reason"] == "length"
    assert got["stream"] == {
        "content": got["content"],
        "finish": "length",
        "completion_tokens": 6,
    }

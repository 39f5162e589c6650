"""Issue 38, item 4: a text request's prompt is bounded by the model's context (or its
`max_prompt_tokens` key), with a 400 at once that names the field and the limit. Before,
a 200k-character prompt held the worker for a minute and got it killed; on a model with
learned positions (GPT-2) a prompt past them was a model error (on a GPU, a device-side
assert that ruins the worker's CUDA context)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hotreload.config import load_config
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import error_of, request
from tests.test_config import GOOD_MODEL, error_for, write

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hotreload.worker.generate import ModelCall, model_context, prompt_bound  # noqa: E402
from hotreload.worker.text_tokenizer import Tokenizer  # noqa: E402
from tests.evalharness.make_lm import served_project  # noqa: E402


def test_max_prompt_tokens_is_read_and_its_mistakes_say_what_to_fix(tmp_path: Path) -> None:
    m = load_config(write(tmp_path, GOOD_MODEL + "generator = true\nmax_prompt_tokens = 64\n"))
    assert m.models[0].max_prompt_tokens == 64
    assert load_config(write(tmp_path, GOOD_MODEL)).models[0].max_prompt_tokens is None
    msg = error_for(tmp_path, GOOD_MODEL + "max_prompt_tokens = 64\n")
    assert "set generator = true" in msg and "max_prompt_tokens" in msg
    msg = error_for(tmp_path, GOOD_MODEL + "generator = true\nmax_prompt_tokens = 0\n")
    assert "max_prompt_tokens" in msg and "between 1 and" in msg
    msg = error_for(tmp_path, GOOD_MODEL + "generator = true\nmax_prompt_tokens = true\n")
    assert "an integer" in msg


def _tokenizer(model_max_length: int) -> Tokenizer:
    return Tokenizer(
        lambda text: [ord(c) for c in text],
        lambda ids: "".join(map(chr, ids)),
        takes_special=False,
        eos_id=None,
        bos_id=None,
        info={"model_max_length": model_max_length},
        source="tok/",
    )


def test_the_context_comes_from_the_config_a_wrapped_model_or_the_tokenizer() -> None:
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_positions=48, n_embd=8, n_layer=1, n_head=2, vocab_size=40)
    )
    assert model_context(gpt2) == (48, "n_positions in its config")

    class Wrapper(torch.nn.Module):  # as examples/tiny_lm wraps its Qwen2 model
        def __init__(self) -> None:
            super().__init__()
            self.lm = transformers.Qwen2ForCausalLM(
                transformers.Qwen2Config(
                    vocab_size=40, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=96,
                )
            )  # fmt: skip

    assert model_context(Wrapper()) == (96, "max_position_embeddings in its config")

    class Yarn:
        config = transformers.Qwen2Config(
            max_position_embeddings=1000,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 500,
            },
        )

    n, where = model_context(Yarn()) or (0, "")
    assert n == 2000 and "yarn RoPE factor 4" in where

    plain = ModelCall.of(torch.nn.Linear(2, 2))
    assert plain.context is None
    # No config says: the tokenizer's model_max_length, unless it is transformers' "none".
    assert prompt_bound(plain, _tokenizer(256)) == (256, "model_max_length of its tokenizer (tok/)")
    assert prompt_bound(plain, _tokenizer(2**31 - 1)) is None


def _complete(url: str, doc: dict[str, Any]) -> tuple[int, Any]:
    body = json.dumps({"model": "lm", **doc}).encode()
    status, _, raw = request(
        url, "/v1/completions", body, {"Content-Type": "application/json"}, timeout=60
    )
    return status, json.loads(raw)


def test_prompts_past_the_context_or_the_key_get_a_400_and_the_worker_serves_on(
    tmp_path: Path, serve: Any
) -> None:
    config = served_project(tmp_path / "proj")  # GPT-2 shaped: n_positions = 512
    config.write_text(config.read_text() + "max_prompt_tokens = 100\n")
    server = serve(config, "--http", "127.0.0.1:0", process_cls=HttpServeProcess)
    url = server.url

    # /v1 errors are OpenAI error objects: the text is the error's message.
    status, body = _complete(url, {"prompt": [5] * 150, "max_tokens": 4})
    assert status == 400, body
    assert "'prompt' has 150 tokens" in body["error"]["message"]
    assert "limit of 100 (max_prompt_tokens" in body["error"]["message"]

    # Within the key, but prompt + max_tokens past the model's 512 positions (vLLM's rule).
    status, body = _complete(url, {"prompt": [5] * 99, "max_tokens": 500})
    assert status == 400, body
    said = body["error"]["message"]
    assert "maximum context length is 512 tokens (n_positions in its config)" in said
    assert "you requested 599 tokens (99 in the prompt, 500 in the completion)" in said
    assert "'max_tokens'" in said

    # One prompt of a batch: named by its index, and none of the batch runs.
    status, body = _complete(url, {"prompt": [[5] * 10, [5] * 150], "max_tokens": 1})
    assert status == 400 and "'prompt'[1] has 150 tokens" in body["error"]["message"], body

    # A long string: measured in tokens, refused the same way (Triton's generate too).
    status, body = _complete(url, {"prompt": "hello world " * 20_000, "max_tokens": 1})
    assert status == 400 and "max_prompt_tokens" in body["error"]["message"], body
    status, _, raw = request(
        url,
        "/v2/models/lm/generate",
        json.dumps({"text_input": "hello world " * 20_000}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 400 and "max_prompt_tokens" in error_of(raw), raw
    assert "'text_input'" in error_of(raw) and "'prompt'" not in error_of(raw), raw

    # The worker was never at risk: the same one answers, no restart.
    status, body = _complete(url, {"prompt": [5] * 90, "max_tokens": 4, "temperature": 0})
    assert status == 200 and body["usage"]["prompt_tokens"] == 90, body
    status, _, raw = request(url, "/v2/models/lm")
    assert status == 200, raw
    assert "worker process was killed" not in server.output
    assert "restarted" not in server.output

"""Chat bodies, `n`, special tokens and OpenAI error objects without a server: what
http/chat.py, http/completions.py and http/replies.py make of a request, and what the
worker's tokenizer (worker/text_tokenizer.py) and choice seeds do with it."""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from hotreload.http.chat import chat_request, chat_response, tokenize_chat_request
from hotreload.http.completions import (
    MAX_CHOICES,
    MAX_N,
    MAX_SEED,
    MIN_SEED,
    TextBodyError,
    completion_request,
    generate_request,
    tokenize_request,
)
from hotreload.http.openai_routes import min_version_of
from hotreload.http.replies import HttpError, error_body, openai_style
from hotreload.worker.text_tokenizer import (
    ChatTemplateError,
    TokenizerError,
    from_folder,
    from_model,
)

USER = [{"role": "user", "content": "hi"}]


def test_a_chat_body_becomes_the_workers_chat_request() -> None:
    req = chat_request(
        {
            "model": "lm",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]},
                {"role": "assistant", "content": "ok", "name": "bot"},
            ],
            "max_completion_tokens": 5,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "stop": "\n",
            "n": 2,
            "logprobs": True,
            "top_logprobs": 3,
        }
    )  # fmt: skip
    assert req == {
        "task": "chat",
        # Text parts are joined by newlines, as vLLM joins them for a string template.
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "ok", "name": "bot"},
        ],
        "add_generation_prompt": True,
        "add_special_tokens": False,
        "n": 2,
        "sampling": {
            "max_tokens": 5,
            "temperature": 0.0,
            "top_p": 0.5,
            "seed": 3,
            "stop": ["\n"],
            "logprobs": 3,
            "echo": False,
            "skip_special_tokens": True,
        },
        "field": "messages",
    }
    # max_tokens is the older name; neither: the worker gives the rest of the context.
    assert chat_request({"messages": USER, "max_tokens": 7})["sampling"]["max_tokens"] == 7
    plain = chat_request({"messages": USER})
    assert plain["sampling"]["max_tokens"] is None and plain["sampling"]["logprobs"] is None
    assert plain["n"] == 1 and plain["sampling"]["temperature"] == 1.0
    # logprobs without top_logprobs: the chosen tokens' only.
    assert chat_request({"messages": USER, "logprobs": True})["sampling"]["logprobs"] == 0


@pytest.mark.parametrize(
    ("doc", "param", "says"),
    [
        ({}, "messages", "'messages' is missing"),
        ({"messages": []}, "messages", "non-empty list of messages"),
        ({"messages": "hi"}, "messages", "non-empty list of messages"),
        ({"messages": [{"role": "usr", "content": "x"}]}, "messages", "'role' must be one of"),
        ({"messages": [{"role": "user"}]}, "messages", "content must be a string"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
            "'messages'[0].content[0] must be a text part",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
            "messages",
            "does not call tools",
        ),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools", "'tools' is not supported"),
        (
            {"messages": USER, "response_format": {"type": "json_object"}},
            "response_format",
            "'response_format' is not supported",
        ),
        ({"messages": USER, "stream": "yes"}, "stream", "'stream' must be true or false"),
        ({"messages": USER, "n": 0}, "n", f"'n' must be an integer from 1 to {MAX_N}"),
        ({"messages": USER, "n": True}, "n", "'n' must be an integer"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
        ({"messages": USER, "logprobs": 2}, "logprobs", "'logprobs' must be true or false"),
        ({"messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs", "0 to 20"),
        (
            {"messages": USER, "max_tokens": 3, "max_completion_tokens": 4},
            "max_completion_tokens",
            "disagree",
        ),
        ({"messages": USER, "temperature": 3}, "temperature", "'temperature' must be a number"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages", "lone surrogate"),
        # The template writes a message's name into the prompt: text the tokenizer takes.
        (
            {"messages": [{"role": "user", "content": "hi", "name": "a\udc00"}]},
            "messages",
            "'messages'[0].name holds a lone surrogate (U+DC00",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages",
            "'messages'[0].content[0] needs a 'text' string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
            "messages",
            "'messages'[0].content[0] needs a 'text' string ({'type': 'text', 'text': '...'}), "
            "got a number",
        ),
        (
            {"messages": USER, "skip_special_tokens": 1},
            "skip_special_tokens",
            "'skip_special_tokens' must be true or false",
        ),
    ],
)
def test_a_wrong_chat_body_names_its_field(doc: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(TextBodyError, match=re.escape(says)) as err:
        chat_request(doc)
    assert err.value.param == param


def test_n_choices_per_prompt_are_bounded() -> None:
    assert completion_request({"prompt": ["a", "b"], "n": 3})["n"] == 3
    assert completion_request({"prompt": "a"})["n"] == 1
    for bad in (0, MAX_N + 1, 1.5, True, "2"):
        with pytest.raises(TextBodyError, match=f"'n' must be an integer from 1 to {MAX_N}"):
            completion_request({"prompt": "a", "n": bad})
    # prompts x n is bounded too: the message says both ways to fit.
    prompts = ["a"] * (MAX_CHOICES // 2 + 1)
    with pytest.raises(TextBodyError, match="send fewer prompts per request, or a smaller 'n'"):
        completion_request({"prompt": prompts, "n": 2})


def test_special_tokens_default_to_the_tokenizers_unless_the_request_says() -> None:
    # None: the tokenizer's own default (vLLM's add_special_tokens=True on a string).
    assert completion_request({"prompt": "a"})["add_special_tokens"] is None
    assert (
        completion_request({"prompt": "a", "add_special_tokens": False})["add_special_tokens"]
        is False
    )
    assert tokenize_request({"prompt": "a"})["add_special_tokens"] is None
    assert (
        tokenize_request({"prompt": "a", "add_special_tokens": True})["add_special_tokens"] is True
    )
    # A chat's rendered text gets none unless asked (its template writes them).
    assert tokenize_chat_request({"messages": USER})["add_special_tokens"] is False
    assert (
        chat_request({"messages": USER, "add_special_tokens": True})["add_special_tokens"] is True
    )
    with pytest.raises(TextBodyError, match="'add_special_tokens' must be true or false"):
        tokenize_request({"prompt": "a", "add_special_tokens": "yes"})  # fmt: skip


def test_a_worker_reply_becomes_a_chat_completion() -> None:
    legacy = {
        "tokens": [" é", "!"],
        "token_logprobs": [-0.5, -1.25],
        "top_logprobs": [{" é": -0.5, "x": -2.0}, {"!": -1.25}],
        "text_offset": [0, 2],
    }
    reply = {
        "version": 3,
        "digest": "sha256:ab",
        "choices": [
            {"index": 0, "text": " é!", "logprobs": legacy, "finish_reason": "length"},
            {"index": 1, "text": "", "logprobs": None, "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }
    doc = chat_response("lm", reply)
    assert doc["object"] == "chat.completion" and doc["id"].startswith("chatcmpl-")
    assert (doc["model"], doc["system_fingerprint"], doc["model_version"]) == ("lm", "sha256:ab", 3)
    assert doc["usage"] == reply["usage"]
    first, second = doc["choices"]
    assert first["message"] == {"role": "assistant", "content": " é!"}
    assert first["finish_reason"] == "length" and second["logprobs"] is None
    content = first["logprobs"]["content"]
    assert content[0] == {
        "token": " é",
        "logprob": -0.5,
        "bytes": [32, 195, 169],
        "top_logprobs": [
            {"token": " é", "logprob": -0.5, "bytes": [32, 195, 169]},
            {"token": "x", "logprob": -2.0, "bytes": [120]},
        ],
    }
    assert content[1] == {
        "token": "!",
        "logprob": -1.25,
        "bytes": [33],
        "top_logprobs": [{"token": "!", "logprob": -1.25, "bytes": [33]}],
    }


@pytest.mark.parametrize(
    ("path", "status", "kind"),
    [
        ("/v1/completions", 400, "invalid_request_error"),
        ("/v1/chat/completions", 404, "not_found_error"),
        ("/v1/models", 500, "server_error"),
        ("/tokenize", 503, "service_unavailable"),
        ("/detokenize", 504, "timeout_error"),
        ("/tokenizer_info", 413, "invalid_request_error"),
        ("/health", 503, "service_unavailable"),
    ],
)
def test_openai_style_routes_answer_openai_error_objects(path: str, status: int, kind: str) -> None:
    assert openai_style(path)
    body = error_body(path, status, "what to fix", "prompt", "bad_request", traceback="tb")
    assert body == {
        "error": {"message": "what to fix", "type": kind, "param": "prompt", "code": "bad_request"},
        "traceback": "tb",
    }


@pytest.mark.parametrize(
    "path", ["/v2/models/lm/infer", "/v2/models/lm/generate", "/metrics", "/v1x"]
)
def test_kserve_routes_keep_their_own_error_shape(path: str) -> None:
    assert not openai_style(path)
    assert error_body(path, 400, "what to fix", "prompt", "bad_request") == {"error": "what to fix"}


# ---------------------------------------------------------------- the worker's tokenizer


def llama_like_folder(folder: Path) -> Any:
    """A tokenizer with a BOS its post-processor adds by default (as Llama's and Gemma's
    do), built in code and saved as save_pretrained writes it; returns it as loaded."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_a_string_gets_the_tokenizers_bos_unless_told_and_a_chat_its_templates(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "tok"
    hf = llama_like_folder(folder)
    tok = from_folder(folder)
    assert tok.encode("hello world") == hf("hello world").input_ids == [1, 3, 4]
    assert tok.encode("hello world", False) == [3, 4]
    with pytest.raises(TokenizerError) as err:
        tok.chat_prompt(USER, True)
    assert "has no chat template" in str(err.value) and "chat_template.jinja" in str(err.value)
    assert "CHAT_TEMPLATE" in str(err.value)

    # Declared as a user would: set it, save again. The folder's new state is re-read.
    hf.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    hf.save_pretrained(folder)
    tok = from_folder(folder)
    text = tok.chat_prompt([{"role": "user", "content": "hello"}], True)
    assert text == "<s>hello " and tok.info["chat_template"] == hf.chat_template
    # The template wrote the BOS: tokenized without adding another (what run_text does).
    assert tok.encode(text, False) == [1, 3]


def _module(**attrs: Any) -> Any:
    module = types.ModuleType("hr_chat_module")
    module.encode = lambda text, add_special_tokens=True: [1] * add_special_tokens + [5]  # type: ignore[attr-defined]
    module.decode = lambda ids: "x"  # type: ignore[attr-defined]
    vars(module).update(attrs)

    class Model:
        pass

    Model.__module__ = module.__name__
    sys.modules[module.__name__] = module
    return Model()


def test_a_modules_chat_template_renders_and_refuses_as_a_hugging_face_one() -> None:
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system messages') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    try:
        tok = from_model(_module(CHAT_TEMPLATE=template))
        assert tok.encode("a") == [1, 5] and tok.encode("a", False) == [5]  # its default
        assert tok.chat_prompt(USER, True) == "<user>hi\n<assistant>"
        assert tok.chat_prompt(USER, False) == "<user>hi\n"
        assert tok.info["chat_template"] == template
        with pytest.raises(ChatTemplateError, match="no system messages"):
            tok.chat_prompt([{"role": "system", "content": "x"}], True)
        with pytest.raises(TokenizerError, match="not a valid Jinja template"):
            from_model(_module(CHAT_TEMPLATE="{% for %}")).chat_prompt(USER, True)
        # A wrong declaration fails chats, and only them.
        wrong = from_model(_module(CHAT_TEMPLATE=3))
        assert wrong.encode("a") == [1, 5]
        with pytest.raises(TokenizerError, match="CHAT_TEMPLATE in module hr_chat_module"):
            wrong.chat_prompt(USER, True)
        assert not from_model(_module()).has_chat_template
    finally:
        sys.modules.pop("hr_chat_module", None)


def test_choice_k_draws_from_seed_plus_k_within_torchs_range() -> None:
    pytest.importorskip("torch")
    from hotreload.worker.text_op import _choice_seed

    assert [_choice_seed(7, k) for k in range(3)] == [7, 8, 9]
    assert _choice_seed(None, 2) is None
    # torch reads a seed modulo 2**64: past the top, choice k wraps to k - 1; a negative
    # seed keeps its own draws for choice 0 and steps on as its 64-bit twin does.
    assert _choice_seed(MAX_SEED, 0) == MAX_SEED and _choice_seed(MAX_SEED, 1) == 0
    assert _choice_seed(MIN_SEED, 0) == MIN_SEED and _choice_seed(-1, 1) == 0
    torch = pytest.importorskip("torch")

    def draws(seed: int) -> list[float]:
        return torch.rand(3, generator=torch.Generator().manual_seed(seed)).tolist()

    assert draws(-1) == draws(MAX_SEED)  # what the modulo relies on


def test_top_p_zero_keeps_only_the_likeliest_token_and_is_not_read_as_one() -> None:
    """OpenAI and vLLM read top_p 0 as "the likeliest token only"; `... or 1.0` had made
    it 1.0 (every token), so n samples at top_p 0 came back as n random strings."""
    assert chat_request({"messages": USER, "top_p": 0})["sampling"]["top_p"] == 0.0
    assert completion_request({"prompt": "a", "top_p": 0})["sampling"]["top_p"] == 0.0
    assert completion_request({"prompt": "a"})["sampling"]["top_p"] == 1.0
    torch = pytest.importorskip("torch")
    from hotreload.worker.generate import Sampling, _pick

    logits = torch.tensor([0.0, 1.0, 0.9, 0.8])
    gen = torch.Generator().manual_seed(0)
    picks = {_pick(logits, Sampling(temperature=2.0, top_p=0.0), gen) for _ in range(200)}
    assert picks == {1}


def test_skip_special_tokens_is_vllms_default_on_both_routes() -> None:
    assert chat_request({"messages": USER})["sampling"]["skip_special_tokens"] is True
    assert completion_request({"prompt": "a"})["sampling"]["skip_special_tokens"] is True
    off = {"prompt": "a", "skip_special_tokens": False}
    assert completion_request(off)["sampling"]["skip_special_tokens"] is False
    chat_off = chat_request({"messages": USER, "skip_special_tokens": False})
    assert chat_off["sampling"]["skip_special_tokens"] is False
    with pytest.raises(TextBodyError, match="'skip_special_tokens' must be true or false"):
        completion_request({"prompt": "a", "skip_special_tokens": "no"})


@pytest.mark.parametrize(
    ("given", "want"),
    [(None, None), (3, 3), (3.0, 3), ("4", 4), (" 5 ", 5), (0, 0)],
)
def test_min_version_is_a_whole_version_number(given: Any, want: int | None) -> None:
    assert min_version_of(given) == want


@pytest.mark.parametrize(
    "bad", [math.inf, -math.inf, math.nan, 1.5, True, False, "x", "1.5", -1, [1], {"v": 1}]
)
def test_a_min_version_that_is_no_version_is_a_400_naming_it(bad: Any) -> None:
    """`"min_version": Infinity` (Python's json reads it) had raised OverflowError in
    int(): a 500 "bug in hotreload"."""
    with pytest.raises(HttpError, match="'min_version' must be a version number") as err:
        min_version_of(bad)
    assert err.value.status == 400 and err.value.param == "min_version"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_anywhere_in_a_text_body_are_400s_naming_the_field(value: float) -> None:
    """Every field the text routes read, set to NaN or +-Infinity (which Python's json
    accepts), is a TextBodyError naming that field, or left out of the request; none raises
    anything else, and what goes to the worker is plain JSON."""
    bodies = [
        (chat_request, {"messages": USER}),
        (tokenize_chat_request, {"messages": USER}),
        (completion_request, {"prompt": "a"}),
        (generate_request, {"text_input": "a"}),
        (tokenize_request, {"prompt": "a"}),
    ]
    fields = [
        "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n",
        "logprobs", "top_logprobs", "stop", "echo", "best_of", "add_special_tokens",
        "add_generation_prompt", "stream", "stream_options", "logit_bias", "tools",
        "presence_penalty", "frequency_penalty", "response_format", "suffix",
        "skip_special_tokens", "stop_words", "parameters",
    ]  # fmt: skip
    for parse, base in bodies:
        for key in fields:
            doc = {**base, key: value}
            try:
                req = parse(doc)
            except TextBodyError as exc:
                assert exc.param is not None and key.split("_")[0] in str(exc), (key, exc)
                continue
            json.dumps(req, allow_nan=False)  # nothing not-a-number reaches the worker

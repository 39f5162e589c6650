"""`/v1/chat/completions`, `n` choices, special tokens and OpenAI error objects against a
live session, compared with the same weights and tokenizer called in this process: a chat's
answer is the in-process greedy continuation of the template-rendered prompt, tokenized
without special tokens added again (vLLM's rule); a string prompt gets the tokenizer's BOS
as `tokenizer(text)` does. Three generators (tests/http/chat_lm.py): "chat" (a Hugging Face
tokenizer with a BOS and a chat template), "lm" (no template), "gen" (examples/tiny_lm)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.http.chat_lm import greedy, in_process
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request
from tests.http.test_real_models import load_module

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4
CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "The capital of France is"},
]


@dataclass
class ChatServer:
    """The shared session of tests/http/conftest.py (`chat_server`) and, loaded in this
    process, the "chat" generator's model and tokenizer."""

    url: str
    root: Path
    model: Any
    tok: Any


@pytest.fixture(scope="module")
def server(chat_server: HttpServeProcess) -> ChatServer:
    root = chat_server.config.parent
    return ChatServer(chat_server.url, root, *in_process(root, "chat"))


def post(url: str, path: str, doc: Any) -> tuple[int, dict[str, str], Any]:
    status, headers, body = request(
        url, path, json.dumps(doc).encode(), {"Content-Type": "application/json"}, timeout=120
    )
    return status, headers, json.loads(body)


def chat(url: str, **doc: Any) -> dict[str, Any]:
    status, headers, got = post(url, "/v1/chat/completions", {"model": "chat", **doc})
    assert status == 200, got
    assert got["system_fingerprint"] == headers["X-Hotreload-Digest"]
    assert str(got["model_version"]) == headers["X-Hotreload-Version"]
    return got


def rendered_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """What the chat route must feed the model: the template's text, tokenized with no
    special tokens added (the template wrote the BOS)."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False).input_ids


def logits_of(model: Any) -> Any:
    return lambda ids: model(input_ids=ids).logits


def test_a_chat_is_the_in_process_greedy_answer_of_its_rendered_prompt(
    server: ChatServer,
) -> None:
    model, tok = server.model, server.tok
    ids = rendered_ids(tok, CHAT)
    # One BOS, the template's: the route did not add a second.
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    status, _, tokenized = post(server.url, "/tokenize", {"model": "chat", "messages": CHAT})
    assert status == 200 and tokenized["tokens"] == ids, tokenized

    want = greedy(logits_of(model), ids, 8, tok.eos_token_id)
    got = chat(
        server.url, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    assert got["object"] == "chat.completion" and len(got["choices"]) == 1
    choice = got["choices"][0]
    made = [t for t in want if t != tok.eos_token_id]
    assert choice["message"] == {"role": "assistant", "content": tok.decode(made)}
    assert choice["finish_reason"] == ("stop" if len(made) < len(want) else "length")
    assert got["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(want),
        "total_tokens": len(ids) + len(want),
    }
    # Each token's log-probability is the in-process one; the greedy pick heads its top 3.
    with torch.inference_mode():
        rows = model(input_ids=torch.tensor([ids + want])).logits[0].float().log_softmax(-1)
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [tok.decode([t]) for t in want]
    for i, (entry, t) in enumerate(zip(content, want, strict=True)):
        assert abs(entry["logprob"] - float(rows[len(ids) + i - 1, t])) <= TOL
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        assert 1 <= len(entry["top_logprobs"]) <= 3

    # max_completion_tokens is the same bound; without either, the rest of the context.
    again = chat(server.url, messages=CHAT, max_completion_tokens=8, temperature=0)
    assert again["choices"][0]["message"] == choice["message"]
    rest = chat(server.url, messages=CHAT, temperature=0)
    usage, finish = rest["usage"], rest["choices"][0]["finish_reason"]
    assert finish == "stop" or usage["total_tokens"] == model.config.n_positions, rest


def test_n_choices_are_ordered_and_each_seeded_choice_repeats(server: ChatServer) -> None:
    url = server.url
    prompts = ["The capital of France is", "One, two, three"]
    ask = {"model": "chat", "max_tokens": 6, "temperature": 1.0, "seed": 5}
    status, _, got = post(url, "/v1/completions", {**ask, "prompt": prompts, "n": 3})
    assert status == 200, got
    texts = [c["text"] for c in got["choices"]]
    assert [c["index"] for c in got["choices"]] == list(range(6))
    # Choice k of prompt i (index i * 3 + k) draws from seed + k: the n = 1 answer to that seed.
    for i, prompt in enumerate(prompts):
        for k in range(3):
            one = post(url, "/v1/completions", {**ask, "prompt": prompt, "seed": 5 + k})[2]
            assert one["choices"][0]["text"] == texts[i * 3 + k], (i, k)
    assert len(set(texts[:3])) > 1, texts  # the choices are samples, not one answer copied
    assert got["usage"]["prompt_tokens"] == sum(len(server.tok(p).input_ids) for p in prompts)
    assert got["usage"]["completion_tokens"] == 6 * 6

    # Greedy: n equal answers, each the in-process one, each counted.
    ids = server.tok(prompts[0]).input_ids
    want = server.tok.decode(greedy(logits_of(server.model), ids, 6, None))
    status, _, greedy_n = post(
        url, "/v1/completions", {**ask, "prompt": prompts[0], "n": 4, "temperature": 0}
    )
    assert [c["text"] for c in greedy_n["choices"]] == [want] * 4
    assert greedy_n["usage"]["completion_tokens"] == 4 * 6

    # A chat with n: the same rule, in the chat format.
    two = chat(url, messages=CHAT, n=2, max_tokens=6, temperature=1.0, seed=11)
    for k, c in enumerate(two["choices"]):
        alone = chat(url, messages=CHAT, max_tokens=6, temperature=1.0, seed=11 + k)
        assert c["index"] == k and c["message"] == alone["choices"][0]["message"]


def test_special_tokens_reach_the_model_as_vllm_adds_them(server: ChatServer) -> None:
    url, tok = server.url, server.tok
    text = "The capital of France is"
    with_bos = tok(text).input_ids
    assert with_bos[0] == tok.bos_token_id  # the tokenizer adds one: the premise
    status, _, got = post(url, "/tokenize", {"model": "chat", "prompt": text})
    assert status == 200 and got["tokens"] == with_bos, got
    bare = post(url, "/tokenize", {"model": "chat", "prompt": text, "add_special_tokens": False})
    assert bare[2]["tokens"] == tok(text, add_special_tokens=False).input_ids == with_bos[1:]

    # A string prompt reaches the model as tokenizer(text) does: BOS first.
    ask = {"model": "chat", "prompt": text, "max_tokens": 4, "temperature": 0}
    echoed = post(url, "/v1/completions", {**ask, "echo": True, "logprobs": 0})[2]
    assert echoed["usage"]["prompt_tokens"] == len(with_bos)
    assert echoed["choices"][0]["logprobs"]["tokens"][: len(with_bos)] == [
        tok.decode([t]) for t in with_bos
    ]
    want = tok.decode(greedy(logits_of(server.model), with_bos, 4, None))
    assert post(url, "/v1/completions", ask)[2]["choices"][0]["text"] == want
    plain = post(url, "/v1/completions", {**ask, "add_special_tokens": False})[2]
    assert plain["usage"]["prompt_tokens"] == len(with_bos) - 1

    # A GPT-2 style tokenizer adds nothing by default: lm-eval's prompts stay as they were.
    lm_tok = in_process(server.root, "lm")[1]
    assert post(url, "/tokenize", {"model": "lm", "prompt": text})[2]["tokens"] == (
        lm_tok(text).input_ids
    )
    # A module's encode: its own default (examples/tiny_lm adds its BOS).
    tiny = load_module(server.root / "tiny.py", "hr_chat_tiny")
    assert post(url, "/tokenize", {"model": "gen", "prompt": text})[2]["tokens"] == (
        tiny.encode(text)
    )


def test_the_tiny_lm_chats_through_its_modules_template(server: ChatServer) -> None:
    import jinja2

    tiny = load_module(server.root / "tiny.py", "hr_chat_tiny_template")
    # Rendered as transformers renders a tokenizer's template (blocks trimmed).
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(tiny.CHAT_TEMPLATE).render(messages=CHAT, add_generation_prompt=True)
    ids = tiny.encode(text, add_special_tokens=False)
    status, _, tokenized = post(server.url, "/tokenize", {"model": "gen", "messages": CHAT})
    assert tokenized["tokens"] == ids, tokenized
    model = tiny.build().eval()
    want = greedy(logits_of(model), ids, 10, tiny.EOS)
    got = post(
        server.url,
        "/v1/chat/completions",
        {"model": "gen", "messages": CHAT, "max_tokens": 10, "temperature": 0},
    )[2]
    assert got["choices"][0]["message"]["content"] == tiny.decode(want), got
    assert got["usage"]["prompt_tokens"] == len(ids)
    status, _, info = request(server.url, "/tokenizer_info?model=gen")
    assert status == 200 and json.loads(info)["chat_template"] == tiny.CHAT_TEMPLATE


def error(status: int, got: dict[str, Any], kind: str, param: str | None) -> str:
    """The message of an OpenAI error object, after checking its shape."""
    assert set(got) == {"error"} and set(got["error"]) == {"message", "type", "param", "code"}
    assert (got["error"]["type"], got["error"]["param"]) == (kind, param), got
    return str(got["error"]["message"])


def test_a_model_without_a_template_or_a_refused_chat_gets_a_400_that_says_why(
    server: ChatServer,
) -> None:
    status, _, got = post(server.url, "/v1/chat/completions", {"model": "lm", "messages": CHAT})
    said = error(status, got, "invalid_request_error", None)
    assert status == 400 and "has no chat template" in said
    # How to declare one, for either kind of tokenizer.
    assert "tokenizer.chat_template" in said and "save_pretrained" in said
    assert "CHAT_TEMPLATE" in said
    developer = [{"role": "developer", "content": "x"}, *CHAT[1:]]
    status, _, got = post(
        server.url, "/v1/chat/completions", {"model": "chat", "messages": developer}
    )
    # The template refused the messages: the error names that field.
    said = error(status, got, "invalid_request_error", "messages")
    assert status == 400 and "chat template" in said and "no developer messages" in said
    # The session serves on.
    assert chat(server.url, messages=CHAT, max_tokens=1)["choices"]


def test_errors_are_openai_objects_on_the_openai_routes_and_v2_keeps_its_own(
    server: ChatServer,
) -> None:
    url = server.url
    cases: list[tuple[str, Any, int, str, str | None, str]] = [
        ("/v1/completions", {"model": "chat", "prompt": "x", "n": 0}, 400,
         "invalid_request_error", "n", "'n' must be an integer from 1 to 128"),
        ("/v1/chat/completions", {"model": "nope", "messages": CHAT}, 404,
         "not_found_error", "model", "unknown model 'nope'"),
        ("/v1/chat/completions", {"model": "chat", "messages": CHAT, "stream": "yes"}, 400,
         "invalid_request_error", "stream", "'stream' must be true or false"),
        ("/v1/chat/completions", {"model": "chat", "messages": CHAT, "max_tokens": 600}, 400,
         "invalid_request_error", "messages", "'messages': this model's maximum context length"),
        ("/tokenize", {"model": "chat", "prompt": 3}, 400,
         "invalid_request_error", "prompt", "'prompt' must be the string to tokenize"),
        ("/detokenize", {"model": "chat", "tokens": [10**6]}, 400,
         "invalid_request_error", "tokens", "'tokens' holds token id"),
    ]  # fmt: skip
    for path, doc, status, kind, param, says in cases:
        got_status, _, got = post(url, path, doc)
        assert got_status == status, (path, got)
        assert says in error(got_status, got, kind, param), (path, got)
    status, _, body = request(url, "/v1/chat/completions", b"{not json", method="POST")
    assert status == 400 and "not valid JSON" in error(status, json.loads(body), *(
        "invalid_request_error", None))  # fmt: skip
    status, _, body = request(url, "/v1/embeddings", b"{}", method="POST")
    assert "no such endpoint" in error(status, json.loads(body), "not_found_error", None)
    # KServe v2 routes: {"error": "..."}, as the Open Inference Protocol says.
    status, _, body = request(url, "/v2/models/nope")
    assert status == 404 and isinstance(json.loads(body)["error"], str)
    status, _, got = post(url, "/v2/models/chat/generate", {"text_input": 3})
    assert status == 400 and "'text_input' must be a string" in got["error"]

    # What Open WebUI and the other clients read besides the completions.
    assert request(url, "/health")[0] == 200
    status, _, body = request(url, "/v1/models")
    models = json.loads(body)["data"]
    assert {m["id"] for m in models} == {"lm", "chat", "gen"}
    assert all({"id", "object", "created", "owned_by"} <= set(m) for m in models)


def test_top_p_zero_samples_the_greedy_answer_every_time(server: ChatServer) -> None:
    """OpenAI reads top_p 0 as "only the likeliest token": at temperature 1, four samples
    are each the in-process greedy answer (it was read as 1.0: four random strings)."""
    model, tok = server.model, server.tok
    ids = rendered_ids(tok, CHAT)
    want = [t for t in greedy(logits_of(model), ids, 8, tok.eos_token_id) if t != tok.eos_token_id]
    got = chat(server.url, messages=CHAT, n=4, max_tokens=8, temperature=1.0, top_p=0)
    assert [c["message"]["content"] for c in got["choices"]] == [tok.decode(want)] * 4
    status, _, body = post(
        server.url,
        "/v1/completions",
        {"model": "chat", "prompt": CHAT[1]["content"], "n": 4, "max_tokens": 8, "top_p": 0},
    )
    prompt = tok(CHAT[1]["content"]).input_ids
    plain = [
        t for t in greedy(logits_of(model), prompt, 8, tok.eos_token_id) if t != tok.eos_token_id
    ]
    assert status == 200 and [c["text"] for c in body["choices"]] == [tok.decode(plain)] * 4

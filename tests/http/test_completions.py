"""The text routes against the model called in this process: `/v1/completions` (echo
logprobs, greedy continuation through the KV cache, seeded sampling), the `openai` client,
the generate extension, the tokenizer routes, the version on every answer, and the errors
that say what to fix, on the session tests/http/conftest.py shares (`lm_server`). The dev
loop over these routes (an edit and a push mid-run change the version that answers, a
broken edit keeps the old one answering) is in tests/http/test_real_models.py, on the
examples/tiny_lm session that file shares."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

TOL = 1e-4


def post(
    url: str, path: str, doc: Any, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    status, headers, body = request(
        url,
        path,
        json.dumps(doc).encode(),
        {"Content-Type": "application/json", **(extra or {})},
        timeout=60,
    )
    return status, headers, json.loads(body)


def in_process_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(-1)


def greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """Greedy decoding by re-running the whole sequence: no cache, nothing shared with the
    server's decode loop."""
    out = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


@dataclass
class LmServer:
    """The shared session of tests/http/conftest.py (`lm_server`: "lm" and "plain") and,
    loaded in this process, the "lm" generator's model and tokenizer."""

    url: str
    model: Any
    tok: Any


@pytest.fixture(scope="module")
def lm(lm_server: HttpServeProcess) -> LmServer:
    folder = lm_server.config.parent / "lm"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return LmServer(lm_server.url, model, transformers.AutoTokenizer.from_pretrained(folder))


def check_echo_logprobs(url: str, model: Any, tok: Any) -> None:
    """What lm-eval reads for a loglikelihood: every prompt token's log-probability, the
    first null; a shift by one or a wrong row scores at chance, so it must match."""
    text = "Question: What color is the sky on a clear day?\nAnswer: blue"
    ids = tok(text).input_ids
    for prompt in (text, ids):
        status, headers, doc = post(
            url,
            "/v1/completions",
            {
                "model": "lm",
                "prompt": prompt,
                "max_tokens": 1,
                "echo": True,
                "logprobs": 1,
                "temperature": 0,
            },
        )
        assert status == 200, doc
        lp = doc["choices"][0]["logprobs"]
        want = in_process_logprobs(model, ids)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        got = lp["token_logprobs"][1 : len(ids)]
        expected = [float(want[i - 1, t]) for i, t in enumerate(ids) if i > 0]
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= TOL
        # The one new token is scored by the last prompt row; top-1 is the greedy pick.
        nxt = int(want[-1].argmax())
        assert abs(lp["token_logprobs"][-1] - float(want[-1, nxt])) <= TOL
        assert max(lp["top_logprobs"][-1].values()) == lp["token_logprobs"][-1]
        assert len(lp["tokens"]) == len(ids) + 1 == len(lp["text_offset"])
        assert "".join(lp["tokens"][: len(ids)]) == text and lp["text_offset"][0] == 0
        assert doc["usage"] == {
            "prompt_tokens": len(ids),
            "completion_tokens": 1,
            "total_tokens": len(ids) + 1,
        }
        assert doc["system_fingerprint"] == headers["X-Hotreload-Digest"].strip()
        assert doc["system_fingerprint"].startswith("sha256:")


def test_completions_are_the_models_own(lm: LmServer) -> None:
    url, model, tok = lm.url, lm.model, lm.tok
    check_echo_logprobs(url, model, tok)

    # Greedy continuation through the KV cache = greedy without one, in this process.
    prompt = "The capital of France is"
    ids = tok(prompt).input_ids
    status, headers, doc = post(
        url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0}
    )
    assert status == 200, doc
    want = tok.decode(greedy(model, ids, 8))
    assert doc["choices"][0]["text"] == want and doc["choices"][0]["finish_reason"] == "length"
    assert headers["X-Hotreload-Version"] == "1" and doc["model_version"] == 1

    # The openai client, as users write it.
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    got = client.completions.create(
        model="lm", prompt=[prompt, "One, two"], max_tokens=8, temperature=0
    )
    assert got.choices[0].text == want and len(got.choices) == 2
    assert got.system_fingerprint == doc["system_fingerprint"]
    assert [m.id for m in client.models.list().data] == ["lm"]
    # A stop string cuts the text before it.
    stop = want[2:4]
    cut = client.completions.create(
        model="lm", prompt=prompt, max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == want[: want.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # Seeded sampling repeats itself.
    a, b = (
        client.completions.create(
            model="lm", prompt=prompt, max_tokens=8, seed=7, temperature=1.0, top_p=0.9
        )
        .choices[0]
        .text
        for _ in range(2)
    )
    assert a == b

    # Triton's generate extension answers the same text.
    status, _, gen = post(
        url, "/v2/models/lm/generate", {"text_input": prompt, "parameters": {"max_tokens": 8}}
    )
    assert status == 200 and gen["text_output"] == want and gen["model_version"] == "1"

    # Tokenizer routes: what lm-eval's remote tokenizer calls.
    status, _, t = post(url, "/tokenize", {"prompt": prompt, "add_special_tokens": False})
    assert t["tokens"] == ids
    assert post(url, "/detokenize", {"tokens": ids})[2]["prompt"] == prompt
    status, _, info = request(url, "/tokenizer_info")
    assert json.loads(info)["eos_token"] == tok.eos_token

    status, _, metrics = request(url, "/metrics")
    line = next(
        x
        for x in metrics.decode().splitlines()
        if x.startswith('hotreload_generation_tokens_per_second{model="lm"}')
    )
    assert float(line.split()[-1]) > 0
    check_bad_requests(url)


BAD_REQUESTS = [
    ({"model": "plain", "prompt": "x"}, 400, "'plain' is not a text generator"),
    ({"model": "nope", "prompt": "x"}, 404, "unknown model 'nope'"),
    ({"model": "lm", "prompt": "x", "n": 0}, 400, "'n' must be an integer from 1 to 128"),
    ({"model": "lm", "prompt": "x", "stream": "yes"}, 400, "'stream' must be true or false"),
    ({"model": "lm"}, 400, "'prompt' is missing"),
    ({"model": "lm", "prompt": [1, "a"]}, 400, "'prompt' mixes kinds"),
    ({"model": "lm", "prompt": "x", "logprobs": 99}, 400, "'logprobs' must be an integer"),
    ({"model": "lm", "prompt": "x", "temperature": -1}, 400, "'temperature' must be"),
    ({"model": "lm", "prompt": "x", "min_version": "new"}, 400, "'min_version' must be"),
]


def check_bad_requests(url: str) -> None:
    for body, status, says in BAD_REQUESTS:
        got, _, doc = post(url, "/v1/completions", body)
        # OpenAI's error object, so the openai SDK's exception prints the message.
        assert got == status and says in doc["error"]["message"], (body, doc)
    # The generate extension is a KServe v2 route: its errors keep the v2 shape.
    got, _, doc = post(url, "/v2/models/plain/generate", {"text_input": "x"})
    assert got == 400 and "not a text generator" in doc["error"]

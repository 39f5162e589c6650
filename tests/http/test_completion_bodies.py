"""OpenAI completions and generate-extension bodies, checked into the worker's text
request without a server (http/completions.py)."""

from __future__ import annotations

import pytest

from hotreload.http.completions import (
    TextBodyError,
    completion_request,
    generate_request,
    prompts_of,
)


def test_prompts_in_every_form_openai_takes() -> None:
    assert prompts_of("a") == ["a"]
    assert prompts_of(["a", "b"]) == ["a", "b"]
    assert prompts_of([1, 2, 3]) == [[1, 2, 3]]
    assert prompts_of([[1], [2, 3]]) == [[1], [2, 3]]
    for bad in ([], [[]], [1, -2], None, 3, [True]):
        with pytest.raises(TextBodyError, match="prompt"):
            prompts_of(bad)


def test_what_lm_eval_sends_for_a_loglikelihood() -> None:
    req = completion_request(
        {
            "model": "lm",
            "prompt": [[5, 6, 7]],
            "temperature": 0,
            "max_tokens": 1,
            "logprobs": 1,
            "seed": 1234,
            "echo": True,
        }
    )
    assert req["prompts"] == [[5, 6, 7]]
    assert req["sampling"] == {
        "max_tokens": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 1234,
        "stop": [],
        "logprobs": 1,
        "echo": True,
        # vLLM's default; the answer's text only (echo and logprobs keep their tokens).
        "skip_special_tokens": True,
    }
    # Defaults are OpenAI's: 16 tokens, temperature 1.
    assert completion_request({"prompt": "x"})["sampling"]["max_tokens"] == 16
    assert completion_request({"prompt": "x", "stop": "\n"})["sampling"]["stop"] == ["\n"]


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"prompt": "x", "suffix": "y"}, "'suffix' is not supported"),
        ({"prompt": "x", "presence_penalty": 0.5}, "'presence_penalty' is not supported"),
        ({"prompt": "x", "best_of": 3}, "'best_of' must be 1"),
        ({"prompt": "x", "echo": "yes"}, "'echo' must be true or false"),
        ({"prompt": "x", "max_tokens": -1}, "'max_tokens' must be an integer"),
        ({"prompt": "x", "top_p": 2}, "'top_p' must be a number from 0 to 1"),
        ({"prompt": "x", "stop": [1]}, "'stop' must be a string or a list of strings"),
        ({"prompt": "x", "seed": 1.5}, "'seed' must be an integer"),
    ],
)
def test_refused_fields_name_themselves(doc: dict, says: str) -> None:
    with pytest.raises(TextBodyError, match=says):
        completion_request(doc)


def test_generate_extension_is_greedy_unless_told() -> None:
    req = generate_request({"text_input": "hi", "parameters": {"max_tokens": 4, "stop": "."}})
    assert req["prompts"] == ["hi"]
    assert req["sampling"]["temperature"] == 0.0 and req["sampling"]["stop"] == ["."]
    assert req["sampling"]["max_tokens"] == 4 and req["sampling"]["echo"] is False
    with pytest.raises(TextBodyError, match="'text_input' must be a string"):
        generate_request({"parameters": {}})

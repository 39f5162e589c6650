"""OpenAI legacy completions and the Triton generate extension, as plain data: a request
body checked into the worker's `text` request, a worker reply turned into a response body.

No HTTP here (http/openai_routes.py serves them). Every problem is a `TextBodyError` whose
message names the field and what it accepts, answered as HTTP 400.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from hotreload.protocol.header_fields import json_type

#: The most top-k entries a request may ask for per token (vLLM's bound; OpenAI's is 5).
MAX_LOGPROBS = 20
#: A request's largest prompt count and new tokens: bounds, not tuning.
MAX_PROMPTS = 1024
MAX_NEW_TOKENS = 1 << 20
#: The seeds torch's generator takes (`manual_seed`: a signed or unsigned 64-bit integer).
MIN_SEED, MAX_SEED = -(1 << 63), (1 << 64) - 1
#: OpenAI fields that would change the answer and that hotreload does not implement: a
#: request that sets them gets a 400 rather than an answer that ignored them.
_UNSUPPORTED = {
    "suffix": None,
    "logit_bias": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
}


class TextBodyError(ValueError):
    """A text request's body is wrong; the message says which field and what to send."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(doc: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = doc.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise TextBodyError(f"'{key}' must be a number from {lo:g} to {hi:g}, got {v!r}")
    return float(v)


def _int(doc: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v = doc.get(key)
    if v is None:
        return default
    if not _is_int(v) or not lo <= v <= hi:
        raise TextBodyError(f"'{key}' must be an integer from {lo} to {hi}, got {v!r}")
    return int(v)


def _text(v: str, where: str) -> str:
    """`v`, or TextBodyError when it cannot be tokenized: JSON lets a string carry a lone
    UTF-16 surrogate (\\ud800), which no UTF-8 tokenizer can encode."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TextBodyError(
            f"{where} holds a lone surrogate (U+{ord(v[exc.start]):04X} at character "
            f"{exc.start}), which is not text: send valid Unicode (a surrogate pair, or the "
            "character itself)"
        ) from None
    return v


def _token_ids(v: Any, where: str) -> list[int]:
    if not v or not all(_is_int(i) and i >= 0 for i in v):
        raise TextBodyError(f"{where} must be a non-empty list of token ids (integers >= 0)")
    return list(v)


def prompts_of(v: Any) -> list[str | list[int]]:
    """`prompt` as OpenAI takes it: a string, a list of strings, a list of token ids, or a
    list of token-id lists; one choice per prompt."""
    if isinstance(v, str):
        return [_text(v, "'prompt'")]
    if isinstance(v, list) and v:
        if all(isinstance(p, str) for p in v):
            out: list[str | list[int]] = [_text(p, f"'prompt'[{i}]") for i, p in enumerate(v)]
        elif all(_is_int(p) for p in v):
            out = [_token_ids(v, "'prompt'")]
        elif all(isinstance(p, list) for p in v):
            out = [_token_ids(p, f"'prompt'[{i}]") for i, p in enumerate(v)]
        else:
            raise TextBodyError(
                "'prompt' mixes kinds: send a string, a list of strings, a list of token ids "
                "or a list of token-id lists"
            )
        if len(out) > MAX_PROMPTS:
            raise TextBodyError(f"'prompt' holds {len(out)} prompts; at most {MAX_PROMPTS}")
        return out
    raise TextBodyError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of "
        f"token-id lists, got {json_type(v) if v != [] else 'an empty list'}"
    )


def stops_of(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise TextBodyError(f"'stop' must be a string or a list of strings, got {json_type(v)}")


def sampling_of(doc: dict[str, Any], *, default_max_tokens: int = 16) -> dict[str, Any]:
    """The decoding settings of an OpenAI (or generate-extension) body, checked."""
    logprobs = doc.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
        raise TextBodyError(
            f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS} (the top-k per token; "
            f"legacy completions), got {logprobs!r}"
        )
    echo = doc.get("echo", False)
    if not isinstance(echo, bool):
        raise TextBodyError(f"'echo' must be true or false, got {echo!r}")
    return {
        "max_tokens": _int(doc, "max_tokens", default_max_tokens, 0, MAX_NEW_TOKENS),
        "temperature": _number(doc, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(doc, "top_p", 1.0, 0.0, 1.0) or 1.0,
        "seed": _int(doc, "seed", None, MIN_SEED, MAX_SEED),
        "stop": stops_of(doc.get("stop")),
        "logprobs": logprobs,
        "echo": echo,
    }


def completion_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker's `text` request for a `/v1/completions` body."""
    if doc.get("stream"):
        raise TextBodyError("'stream': streaming is not supported; send stream=false")
    for key in ("n", "best_of"):
        # `true == 1` in Python: a bool is checked for, as it is everywhere an int is taken.
        if doc.get(key) is not None and not (_is_int(doc[key]) and doc[key] == 1):
            raise TextBodyError(f"'{key}' must be 1 (one choice per prompt), got {doc[key]!r}")
    for key, neutral in _UNSUPPORTED.items():
        v = doc.get(key)
        if v is not None and v != {} and (isinstance(v, bool) or v != neutral):
            raise TextBodyError(f"'{key}' is not supported by hotreload; leave it out")
    if "prompt" not in doc:
        raise TextBodyError("'prompt' is missing: send the text (or token ids) to complete")
    return {"task": "complete", "prompts": prompts_of(doc["prompt"]), "sampling": sampling_of(doc)}


def completion_response(model: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI `text_completion` object; `system_fingerprint` is the weights' digest."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": reply.get("digest"),
        "choices": reply["choices"],
        "usage": reply["usage"],
        # hotreload's own: the version that answered (system_fingerprint names its weights).
        "model_version": reply.get("version"),
    }


def generate_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker's request for a Triton generate-extension body: `text_input`, and the
    sampling settings at the top level or under `parameters` (as Triton's vLLM backend
    takes them)."""
    text = doc.get("text_input")
    if not isinstance(text, str):
        raise TextBodyError(f"'text_input' must be a string, got {json_type(text)}")
    _text(text, "'text_input'")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise TextBodyError("'parameters' must be a JSON object")
    if params.get("stream") or doc.get("stream"):
        raise TextBodyError("'stream': streaming (generate_stream) is not supported")
    merged = {k: v for k, v in doc.items() if k not in ("text_input", "parameters")}
    merged.update(params)
    merged.pop("logprobs", None)
    merged["echo"] = False
    # Triton's examples decode greedily unless told: temperature 0 by default here.
    merged.setdefault("temperature", 0.0)
    sampling = sampling_of(merged)
    sampling["stop"] = sampling["stop"] or stops_of(merged.get("stop_words"))
    # The worker names this route's field in its 400s (a prompt past the context, say).
    return {"task": "complete", "prompts": [text], "sampling": sampling, "field": "text_input"}


def generate_response(model: str, reply: dict[str, Any]) -> dict[str, Any]:
    choice = reply["choices"][0]
    return {
        "model_name": model,
        "model_version": str(reply.get("version")),
        "text_output": choice["text"],
        "finish_reason": choice["finish_reason"],
        "usage": reply["usage"],
        "weights_digest": reply.get("digest"),
    }


def tokenize_request(doc: dict[str, Any]) -> dict[str, Any]:
    text = doc.get("prompt", doc.get("text"))
    if not isinstance(text, str):
        raise TextBodyError(f"'prompt' must be the string to tokenize, got {json_type(text)}")
    _text(text, "'prompt'")
    special = doc.get("add_special_tokens", False)
    if not isinstance(special, bool):
        raise TextBodyError(f"'add_special_tokens' must be true or false, got {special!r}")
    return {"task": "tokenize", "prompt": text, "add_special_tokens": special}


def detokenize_request(doc: dict[str, Any]) -> dict[str, Any]:
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
        raise TextBodyError("'tokens' must be a list of token ids (integers >= 0)")
    return {"task": "detokenize", "tokens": tokens}

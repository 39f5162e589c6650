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
#: The most choices per prompt (`n`), and per request (prompts times n): bounds, not tuning.
MAX_N = 128
MAX_CHOICES = 1024
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
    """A text request's body is wrong; the message says which field and what to send,
    `param` names that field (OpenAI's error object carries it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def number_of(doc: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = doc.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise TextBodyError(f"'{key}' must be a number from {lo:g} to {hi:g}, got {v!r}", key)
    return float(v)


def int_of(doc: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v = doc.get(key)
    if v is None:
        return default
    if not _is_int(v) or not lo <= v <= hi:
        raise TextBodyError(f"'{key}' must be an integer from {lo} to {hi}, got {v!r}", key)
    return int(v)


def _param(where: str) -> str:
    """The field a message's `where` names: `'prompt'[1]` -> `prompt`."""
    return where.split("'")[1] if where.count("'") >= 2 else where


def checked_text(v: str, where: str) -> str:
    """`v`, or TextBodyError when it cannot be tokenized: JSON lets a string carry a lone
    UTF-16 surrogate (\\ud800), which no UTF-8 tokenizer can encode."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TextBodyError(
            f"{where} holds a lone surrogate (U+{ord(v[exc.start]):04X} at character "
            f"{exc.start}), which is not text: send valid Unicode (a surrogate pair, or the "
            "character itself)",
            _param(where),
        ) from None
    return v


def _token_ids(v: Any, where: str) -> list[int]:
    if not v or not all(_is_int(i) and i >= 0 for i in v):
        raise TextBodyError(
            f"{where} must be a non-empty list of token ids (integers >= 0)", _param(where)
        )
    return list(v)


def flag_of(doc: dict[str, Any], key: str, default: bool | None) -> bool | None:
    v = doc.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise TextBodyError(f"'{key}' must be true or false, got {v!r}", key)
    return v


def choices_of(doc: dict[str, Any], prompts: int) -> int:
    """`n`, checked: choices per prompt, with `prompts` times n within MAX_CHOICES."""
    n = int_of(doc, "n", 1, 1, MAX_N)
    assert n is not None
    if prompts * n > MAX_CHOICES:
        raise TextBodyError(
            f"'n' = {n} for {prompts} prompts asks for {prompts * n} choices; at most "
            f"{MAX_CHOICES} per request: send fewer prompts per request, or a smaller 'n'",
            "n",
        )
    return n


def refuse_unsupported(doc: dict[str, Any], fields: dict[str, Any]) -> None:
    """A 400 for a field that would change the answer and that hotreload does not
    implement (set to anything but its neutral value), rather than an answer ignoring it."""
    for key, neutral in fields.items():
        v = doc.get(key)
        if v is not None and v != {} and (isinstance(v, bool) or v != neutral):
            raise TextBodyError(f"'{key}' is not supported by hotreload; leave it out", key)


def stream_of(doc: dict[str, Any]) -> bool | None:
    """`stream` and `stream_options` of an OpenAI body, checked (http/streaming.py serves
    a stream): None when the answer is not streamed, else whether a usage chunk ends it
    (`stream_options.include_usage`)."""
    if not flag_of(doc, "stream", False):
        if doc.get("stream_options") is not None:
            raise TextBodyError(
                "'stream_options' is only allowed with 'stream': true", "stream_options"
            )
        return None
    options = doc.get("stream_options") or {}
    if not isinstance(options, dict):
        raise TextBodyError(
            "'stream_options' must be an object ({'include_usage': true}), got "
            f"{json_type(options)}",
            "stream_options",
        )
    if options.get("continuous_usage_stats"):
        raise TextBodyError(
            "'stream_options.continuous_usage_stats' is not supported by hotreload: send "
            "include_usage for one usage chunk at the end",
            "stream_options",
        )
    # include_obfuscation pads deltas against a network observer: nothing to the answer.
    unknown = set(options) - {"include_usage", "continuous_usage_stats", "include_obfuscation"}
    if unknown:
        raise TextBodyError(
            f"'stream_options' has no field {sorted(unknown)[0]!r}; it takes include_usage",
            "stream_options",
        )
    include = flag_of(options, "include_usage", False)
    return bool(include)


def stream_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker's `stream` field of a text request: present (true) when streamed."""
    return {"stream": True} if stream_of(doc) is not None else {}


def prompts_of(v: Any) -> list[str | list[int]]:
    """`prompt` as OpenAI takes it: a string, a list of strings, a list of token ids, or a
    list of token-id lists; one choice per prompt."""
    if isinstance(v, str):
        return [checked_text(v, "'prompt'")]
    if isinstance(v, list) and v:
        if all(isinstance(p, str) for p in v):
            out: list[str | list[int]] = [
                checked_text(p, f"'prompt'[{i}]") for i, p in enumerate(v)
            ]
        elif all(_is_int(p) for p in v):
            out = [_token_ids(v, "'prompt'")]
        elif all(isinstance(p, list) for p in v):
            out = [_token_ids(p, f"'prompt'[{i}]") for i, p in enumerate(v)]
        else:
            raise TextBodyError(
                "'prompt' mixes kinds: send a string, a list of strings, a list of token ids "
                "or a list of token-id lists",
                "prompt",
            )
        if len(out) > MAX_PROMPTS:
            raise TextBodyError(
                f"'prompt' holds {len(out)} prompts; at most {MAX_PROMPTS}", "prompt"
            )
        return out
    raise TextBodyError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of "
        f"token-id lists, got {json_type(v) if v != [] else 'an empty list'}",
        "prompt",
    )


def skip_special_of(doc: dict[str, Any]) -> bool:
    """vLLM's `skip_special_tokens`: whether the answer's text leaves out the special
    tokens the model generated (default true, as vLLM's)."""
    skip = flag_of(doc, "skip_special_tokens", True)
    return bool(skip)


def stops_of(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise TextBodyError(f"'stop' must be a string or a list of strings, got {json_type(v)}", "stop")


def sampling_of(doc: dict[str, Any], *, default_max_tokens: int = 16) -> dict[str, Any]:
    """The decoding settings of an OpenAI (or generate-extension) body, checked."""
    logprobs = doc.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_LOGPROBS):
        raise TextBodyError(
            f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS} (the top-k per token; "
            f"legacy completions), got {logprobs!r}",
            "logprobs",
        )
    echo = flag_of(doc, "echo", False)
    return {
        "max_tokens": int_of(doc, "max_tokens", default_max_tokens, 0, MAX_NEW_TOKENS),
        "temperature": number_of(doc, "temperature", 1.0, 0.0, 2.0),
        # 0 keeps only the likeliest token (OpenAI's and vLLM's reading), not "no top_p".
        "top_p": number_of(doc, "top_p", 1.0, 0.0, 1.0),
        "seed": int_of(doc, "seed", None, MIN_SEED, MAX_SEED),
        "stop": stops_of(doc.get("stop")),
        "logprobs": logprobs,
        "echo": echo,
        "skip_special_tokens": skip_special_of(doc),
    }


def completion_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker's `text` request for a `/v1/completions` body: `n` choices per prompt
    (choice k of prompt i at index i * n + k), string prompts tokenized with the
    tokenizer's special tokens unless `add_special_tokens` is false (vLLM's default)."""
    best_of = doc.get("best_of")
    # `true == 1` in Python: a bool is checked for, as it is everywhere an int is taken.
    if best_of is not None and not (_is_int(best_of) and best_of == 1):
        raise TextBodyError(
            f"'best_of' must be 1 (hotreload returns every choice it makes; ask for more "
            f"with 'n'), got {best_of!r}",
            "best_of",
        )
    refuse_unsupported(doc, _UNSUPPORTED)
    if "prompt" not in doc:
        raise TextBodyError(
            "'prompt' is missing: send the text (or token ids) to complete", "prompt"
        )
    prompts = prompts_of(doc["prompt"])
    return {
        "task": "complete",
        "prompts": prompts,
        "n": choices_of(doc, len(prompts)),
        "add_special_tokens": flag_of(doc, "add_special_tokens", None),
        "sampling": sampling_of(doc),
        **stream_request(doc),
    }


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
        raise TextBodyError(f"'text_input' must be a string, got {json_type(text)}", "text_input")
    checked_text(text, "'text_input'")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise TextBodyError("'parameters' must be a JSON object", "parameters")
    if params.get("stream") or doc.get("stream"):
        raise TextBodyError("'stream': streaming (generate_stream) is not supported", "stream")
    merged = {k: v for k, v in doc.items() if k not in ("text_input", "parameters")}
    merged.update(params)
    merged.pop("logprobs", None)
    merged["echo"] = False
    # Triton's examples decode greedily unless told: temperature 0 by default here.
    merged.setdefault("temperature", 0.0)
    sampling = sampling_of(merged)
    sampling["stop"] = sampling["stop"] or stops_of(merged.get("stop_words"))
    # The worker names this route's field in its 400s (a prompt past the context, say).
    return {
        "task": "complete",
        "prompts": [text],
        "add_special_tokens": flag_of(merged, "add_special_tokens", None),
        "sampling": sampling,
        "field": "text_input",
    }


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
    """vLLM's `/tokenize` of a `prompt`: with the tokenizer's special tokens unless
    `add_special_tokens` is false, as vLLM does (`messages`: http/chat.py)."""
    special = flag_of(doc, "add_special_tokens", None)
    text = doc.get("prompt", doc.get("text"))
    if not isinstance(text, str):
        raise TextBodyError(
            f"'prompt' must be the string to tokenize (or send 'messages' to tokenize a "
            f"chat), got {json_type(text)}",
            "prompt",
        )
    checked_text(text, "'prompt'")
    return {"task": "tokenize", "prompt": text, "add_special_tokens": special}


def detokenize_request(doc: dict[str, Any]) -> dict[str, Any]:
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
        raise TextBodyError("'tokens' must be a list of token ids (integers >= 0)", "tokens")
    return {"task": "detokenize", "tokens": tokens}

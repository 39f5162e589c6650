"""OpenAI chat completions as plain data: a `/v1/chat/completions` body checked into the
worker's `text` request (task "chat"), and the worker's reply shaped into a
`chat.completion` object.

The worker renders the messages with the model's chat template (a Hugging Face tokenizer's
`chat_template`, or `CHAT_TEMPLATE` in the model's module) and tokenizes the text without
adding special tokens again (the template wrote them), as vLLM does; then it decodes as a
completion does. No HTTP here (http/openai_routes.py serves it); every problem is a
`TextBodyError` naming the field, answered as HTTP 400.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from hotreload.http.completions import (
    MAX_LOGPROBS,
    MAX_NEW_TOKENS,
    MAX_SEED,
    MIN_SEED,
    TextBodyError,
    checked_text,
    choices_of,
    flag_of,
    int_of,
    number_of,
    refuse_unsupported,
    skip_special_of,
    stops_of,
    stream_request,
)
from hotreload.protocol.header_fields import json_type

#: The roles a message may have (OpenAI's, without tools: hotreload does not call tools).
ROLES = ("system", "developer", "user", "assistant")
#: The most messages a chat may hold: a bound, not tuning (the 1 MiB header bounds the text).
MAX_MESSAGES = 4096
#: Chat fields that would change the answer and that hotreload does not implement, with
#: their neutral value: a request setting them otherwise gets a 400, not an answer that
#: ignored them.
_UNSUPPORTED: dict[str, Any] = {
    "tools": [],
    "functions": [],
    "logit_bias": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "response_format": {"type": "text"},
    "audio": None,
    "prediction": None,
}


def _content(v: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (joined by newlines,
    as vLLM joins them for a template that takes strings)."""
    if isinstance(v, str):
        return checked_text(v, where)
    if isinstance(v, list) and v:
        texts = []
        for j, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and not isinstance(part.get("text"), str):
                raise TextBodyError(
                    f"{where}[{j}] needs a 'text' string ({{'type': 'text', 'text': '...'}}), "
                    f"got {json_type(part.get('text')) if 'text' in part else 'none'}",
                    "messages",
                )
            if kind != "text":
                got = repr(kind) if kind is not None else json_type(part)
                raise TextBodyError(
                    f"{where}[{j}] must be a text part ({{'type': 'text', 'text': '...'}}), "
                    f"got {got}: this model takes text only",
                    "messages",
                )
            texts.append(checked_text(part["text"], f"{where}[{j}]"))
        return "\n".join(texts)
    raise TextBodyError(
        f"{where} must be a string or a list of text parts, got {json_type(v)}", "messages"
    )


def messages_of(v: Any) -> list[dict[str, str]]:
    """`messages`, checked: a non-empty list of {role, content[, name]} with text content;
    what the chat template reads."""
    if not isinstance(v, list) or not v:
        got = "an empty list" if v == [] else json_type(v)
        raise TextBodyError(
            "'messages' must be a non-empty list of messages ({'role': 'user', 'content': "
            f"'...'}}), got {got}",
            "messages",
        )
    if len(v) > MAX_MESSAGES:
        raise TextBodyError(
            f"'messages' holds {len(v)} messages; at most {MAX_MESSAGES}", "messages"
        )
    out = []
    for i, m in enumerate(v):
        where = f"'messages'[{i}]"
        if not isinstance(m, dict):
            raise TextBodyError(f"{where} must be an object, got {json_type(m)}", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise TextBodyError(
                f"{where}: 'role' must be one of {', '.join(ROLES)}, got {role!r}", "messages"
            )
        if m.get("tool_calls") or m.get("function_call"):
            raise TextBodyError(
                f"{where} carries tool calls: hotreload does not call tools; leave them out",
                "messages",
            )
        msg = {"role": role, "content": _content(m.get("content"), f"{where}.content")}
        if m.get("name") is not None:
            if not isinstance(m["name"], str):
                raise TextBodyError(f"{where}: 'name' must be a string", "messages")
            # The template writes it into the prompt: it must be text the tokenizer takes.
            msg["name"] = checked_text(m["name"], f"{where}.name")
        out.append(msg)
    return out


def _max_tokens(doc: dict[str, Any]) -> int | None:
    """`max_completion_tokens` (OpenAI's current name) or `max_tokens` (its older one);
    None: the rest of the context (the worker works it out, as vLLM does)."""
    new = int_of(doc, "max_completion_tokens", None, 0, MAX_NEW_TOKENS)
    old = int_of(doc, "max_tokens", None, 0, MAX_NEW_TOKENS)
    if new is not None and old is not None and new != old:
        raise TextBodyError(
            f"'max_completion_tokens' ({new}) and 'max_tokens' ({old}) disagree: send one",
            "max_completion_tokens",
        )
    return new if new is not None else old


def _top_logprobs(doc: dict[str, Any]) -> int | None:
    """Chat's logprobs: `logprobs: true` and `top_logprobs` k -> the worker's top-k (None:
    no logprobs)."""
    wanted = flag_of(doc, "logprobs", False)
    k = int_of(doc, "top_logprobs", None, 0, MAX_LOGPROBS)
    if k is not None and not wanted:
        raise TextBodyError(
            "'top_logprobs' needs 'logprobs': true (chat completions return log-probabilities "
            "only when asked)",
            "top_logprobs",
        )
    return (k or 0) if wanted else None


def chat_prompt_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """What the worker renders: the messages and `add_generation_prompt` (default true:
    the template ends with the assistant's turn opened)."""
    if "messages" not in doc:
        raise TextBodyError("'messages' is missing: send the conversation to answer", "messages")
    return {
        "messages": messages_of(doc["messages"]),
        "add_generation_prompt": flag_of(doc, "add_generation_prompt", True),
    }


def chat_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker's `text` request for a `/v1/chat/completions` body."""
    refuse_unsupported(doc, _UNSUPPORTED)
    fields = chat_prompt_fields(doc)
    return {
        "task": "chat",
        **fields,
        # vLLM's chat field: the rendered text gets none unless the request asks.
        "add_special_tokens": flag_of(doc, "add_special_tokens", False),
        "n": choices_of(doc, 1),
        "sampling": {
            "max_tokens": _max_tokens(doc),
            "temperature": number_of(doc, "temperature", 1.0, 0.0, 2.0),
            # 0 keeps only the likeliest token (OpenAI's and vLLM's reading).
            "top_p": number_of(doc, "top_p", 1.0, 0.0, 1.0),
            "seed": int_of(doc, "seed", None, MIN_SEED, MAX_SEED),
            "stop": stops_of(doc.get("stop")),
            "logprobs": _top_logprobs(doc),
            "echo": False,
            "skip_special_tokens": skip_special_of(doc),
        },
        # The worker names this field in its 400s (a chat past the context, say).
        "field": "messages",
        **stream_request(doc),  # `stream`: http/streaming.py answers it
    }


def tokenize_chat_request(doc: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `/tokenize` of `messages`: the template's text, tokenized without adding
    special tokens unless `add_special_tokens` is true (what the chat route feeds the
    model)."""
    return {
        "task": "tokenize",
        **chat_prompt_fields(doc),
        "add_special_tokens": flag_of(doc, "add_special_tokens", False),
    }


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(legacy: dict[str, Any] | None) -> dict[str, Any] | None:
    """The worker's legacy logprobs (tokens, token_logprobs, top_logprobs as text -> value,
    most likely first) in the chat format: `{"content": [{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]}]}`. A token's `bytes` are its decoded text's
    UTF-8 (a token holding part of a character decodes to U+FFFD)."""
    if legacy is None:
        return None
    content = []
    for token, lp, top in zip(
        legacy["tokens"], legacy["token_logprobs"], legacy["top_logprobs"], strict=True
    ):
        entry = _entry(token, lp)
        entry["top_logprobs"] = [_entry(t, v) for t, v in (top or {}).items()]
        content.append(entry)
    return {"content": content, "refusal": None}


def chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """One worker choice (index, text, logprobs, finish_reason) as a chat choice."""
    return {
        "index": choice["index"],
        "message": {"role": "assistant", "content": choice["text"]},
        "logprobs": chat_logprobs(choice.get("logprobs")),
        "finish_reason": choice["finish_reason"],
    }


def chat_response(model: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI `chat.completion` object; `system_fingerprint` is the weights' digest."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": reply.get("digest"),
        "choices": [chat_choice(c) for c in reply["choices"]],
        "usage": reply["usage"],
        # hotreload's own: the version that answered (system_fingerprint names its weights).
        "model_version": reply.get("version"),
    }

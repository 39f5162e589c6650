"""The worker's `text` op: completions, tokenize, detokenize and tokenizer info on the
serving version, on the serving thread (so a reload's drain and swap order it like any
forward), answered with the version and digest that computed it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hotreload.protocol.framing import Frame
from hotreload.worker.adapters import BASE, UnknownAdapter, choose
from hotreload.worker.generate import (
    ModelCall,
    NotAGenerator,
    Sampling,
    TextRequestError,
    check_prompts,
    complete,
    prompt_field,
)
from hotreload.worker.load_error import LoadError
from hotreload.worker.replies import error_header
from hotreload.worker.text_tokenizer import Tokenizer, TokenizerError, tokenizer_for

if TYPE_CHECKING:
    from hotreload.worker.loader import ModelVersion


class ServingWorker(Protocol):
    """What the op reads and counts on the worker (worker/server.py's `Worker`)."""

    spec: dict[str, Any]
    served: int
    failed: int
    busy_since: float | None
    busy_total: float

    def admit(self, h: dict[str, Any]) -> ModelVersion | None: ...

    def send(self, header: dict[str, Any], blobs: list[Any] | None = None) -> None: ...


#: How long an answer waits for a just-swapped version's weights digest.
DIGEST_WAIT_S = 60.0


def _prepared(mv: ModelVersion, folder: str | None) -> tuple[ModelCall, Tokenizer]:
    """The version's call and tokenizer, made once per version (kept on it: they go with it)."""
    made = mv.made.get("text")
    if made is None:
        made = mv.made["text"] = (ModelCall.of(mv.model), tokenizer_for(mv.model, folder))
    return made


def _vocab_size(mv: ModelVersion, call: ModelCall) -> int | None:
    """How many token ids the model takes: the width of its logits for token 0, asked once
    per version. An id past it would fail in the embedding (on CUDA, a device-side assert
    that ends the worker). None when that one-token forward fails: ids go unchecked (the
    request's own forward then says what is wrong)."""
    if "vocab" in mv.made:
        return mv.made["vocab"]
    size: int | None = None
    try:
        with torch.inference_mode():
            logits, _ = call(torch.zeros((1, 1), dtype=torch.long, device=mv.device))
        size = int(logits.shape[-1])
    except Exception:
        size = None
    mv.made["vocab"] = size
    return size


def _check_ids(ids: list[int], vocab: int | None, field: str, *, tokenized: bool) -> None:
    """TextRequestError naming `field` for a token id the model has no row for."""
    bad = next((i for i in ids if not 0 <= i < vocab), None) if vocab is not None else None
    if bad is None:
        return
    if tokenized:
        raise TextRequestError(
            f"the tokenizer turned {field} into token id {bad}, past the model's vocabulary "
            f"of {vocab} ids: the model's tokenizer does not match its weights"
        )
    raise TextRequestError(
        f"{field} holds token id {bad}, past the model's vocabulary: token ids go from 0 to "
        f"{vocab - 1}"
    )


def _choose_adapter(mv: ModelVersion, spec: dict[str, Any], adapter: Any) -> None:
    """Make the request's adapter (None: the default) active; UnknownAdapter when it names
    one the model does not serve, on a model without adapters too (its base answers a
    request that names no adapter, or "base")."""
    if mv.weights.adapters is not None:
        choose(mv, {"adapter": adapter} if adapter is not None else None)
    elif adapter is not None and adapter != BASE:
        name = spec.get("name", "?")
        raise UnknownAdapter(
            f"model {name!r} has no adapters, so no adapter {adapter!r}: send 'model': "
            f"{name!r} for its base weights, or declare the adapter under "
            "[[models.adapters]] in its [[models]] table"
        )


def run_text(mv: ModelVersion, spec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """One text request's reply fields (without id, version, digest)."""
    call, tok = _prepared(mv, spec.get("tokenizer"))
    _choose_adapter(mv, spec, req.get("adapter"))
    task = req.get("task")
    if task == "tokenize":
        ids = tok.encode(str(req["prompt"]), bool(req.get("add_special_tokens", False)))
        return {"tokens": ids}
    if task == "detokenize":
        tokens = [int(i) for i in req["tokens"]]
        _check_ids(tokens, _vocab_size(mv, call), "'tokens'", tokenized=False)
        return {"prompt": tok.decode(tokens)}
    if task == "info":
        return {"info": {**tok.info, "source": tok.source}}
    sampling = Sampling(**req["sampling"])
    # Every prompt is measured before any runs: one over the bound is a 400 at once.
    prompts = [tok.encode(p) if isinstance(p, str) else [int(i) for i in p] for p in req["prompts"]]
    vocab, name = _vocab_size(mv, call), str(req.get("field") or "prompt")
    for i, (ids, sent) in enumerate(zip(prompts, req["prompts"], strict=True)):
        field = prompt_field(i, len(prompts), name)
        _check_ids(ids, vocab, field, tokenized=isinstance(sent, str))
    max_prompt = spec.get("max_prompt_tokens")
    check_prompts(call, tok, prompts, sampling.max_tokens, max_prompt, name)
    choices, prompt_tokens, completion_tokens = [], 0, 0
    first_token_s: float | None = None
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            c = complete(call, tok, ids, sampling, mv.device)
            if first_token_s is None and c.first_token_s is not None:
                first_token_s = time.perf_counter() - t0
            choices.append(
                {
                    "index": i,
                    "text": c.text,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                }
            )
            prompt_tokens += c.prompt_tokens
            completion_tokens += c.completion_tokens
    return {
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "first_token_s": first_token_s,
    }


def op_text(worker: ServingWorker, frame: Frame) -> None:
    """The `text` op on the serving thread: the same deadline skip and busy accounting as
    a forward (build pacing sees generation as serving work)."""
    h = frame.header
    mv = worker.admit(h)
    if mv is None:
        return
    t0 = time.perf_counter()
    try:
        fields = run_text(mv, worker.spec, h.get("text") or {})
    except (NotAGenerator, TokenizerError, TextRequestError, LoadError) as exc:
        # The request or the declaration is wrong, not the model: the client is told why.
        # An adapter left out at a restart (AdapterUnavailable) carries its own code: 503.
        worker.failed += 1
        worker.send(error_header(h["id"], getattr(exc, "code", "bad_request"), str(exc)))
        return
    except BaseException:
        worker.failed += 1
        raise
    finally:
        worker.busy_total += time.monotonic() - worker.busy_since
        worker.busy_since = None
    worker.served += 1
    digest = mv.digest
    if digest is None and mv.digest_future is not None:
        # Just swapped in, still hashing (a ~1 GiB model: ~0.5 s): an eval's answer must
        # name its weights, so it waits for the digest rather than say null.
        digest = mv.digest_future.result(timeout=DIGEST_WAIT_S)
    worker.send(
        {
            "id": h["id"],
            "ok": True,
            "version": mv.version,
            "digest": digest,
            "compute_ms": (time.perf_counter() - t0) * 1000,
            **fields,
        }
    )

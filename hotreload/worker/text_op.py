"""The worker's `text` op: completions, tokenize, detokenize and tokenizer info on the
serving version, on the serving thread (so a reload's drain and swap order it like any
forward), answered with the version and digest that computed it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hotreload.protocol.framing import Frame
from hotreload.worker.adapters import UnknownAdapter, choose
from hotreload.worker.generate import (
    ModelCall,
    NotAGenerator,
    Sampling,
    TextRequestError,
    complete,
)
from hotreload.worker.replies import error_header
from hotreload.worker.text_tokenizer import Tokenizer, TokenizerError, tokenizer_for

if TYPE_CHECKING:
    from hotreload.worker.loader import ModelVersion


class ServingWorker(Protocol):
    """What the op reads and counts on the worker (worker/server.py's `Worker`)."""

    current: ModelVersion | None
    spec: dict[str, Any]
    served: int
    failed: int
    skipped: int
    busy_since: float | None
    busy_total: float

    def send(self, header: dict[str, Any], blobs: list[Any] | None = None) -> None: ...


#: How long an answer waits for a just-swapped version's weights digest.
DIGEST_WAIT_S = 60.0
#: The serving version's call and tokenizer, made once per version (id, then the objects).
_per_version: dict[int, tuple[Any, ModelCall, Tokenizer]] = {}


def _prepared(mv: ModelVersion, folder: str | None) -> tuple[ModelCall, Tokenizer]:
    held = _per_version.get(mv.version)
    if held is not None and held[0] is mv.model:
        return held[1], held[2]
    _per_version.clear()  # one version serves: what an older one made goes with it
    call, tok = ModelCall.of(mv.model), tokenizer_for(mv.model, folder)
    _per_version[mv.version] = (mv.model, call, tok)
    return call, tok


def _prompt_ids(tok: Tokenizer, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special_tokens=False)
    return [int(i) for i in prompt]


def _choice(index: int, c: Any) -> dict[str, Any]:
    return {
        "index": index,
        "text": c.text,
        "logprobs": c.logprobs,
        "finish_reason": c.finish_reason,
    }


def run_text(mv: ModelVersion, spec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """One text request's reply fields (without id, version, digest)."""
    call, tok = _prepared(mv, spec.get("tokenizer"))
    if req.get("adapter") is not None or mv.weights.adapters is not None:
        choose(mv, {"adapter": req["adapter"]} if req.get("adapter") is not None else None)
    task = req.get("task")
    if task == "tokenize":
        ids = tok.encode(str(req["prompt"]), bool(req.get("add_special_tokens", False)))
        return {"tokens": ids}
    if task == "detokenize":
        return {"prompt": tok.decode([int(i) for i in req["tokens"]])}
    if task == "info":
        return {"info": {**tok.info, "source": tok.source}}
    sampling = Sampling(**req["sampling"])
    choices, prompt_tokens, completion_tokens = [], 0, 0
    first_token_s: float | None = None
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, prompt in enumerate(req["prompts"]):
            c = complete(call, tok, _prompt_ids(tok, prompt), sampling, mv.device)
            if first_token_s is None and c.first_token_s is not None:
                first_token_s = time.perf_counter() - t0
            choices.append(_choice(i, c))
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
    except (NotAGenerator, TokenizerError, TextRequestError, UnknownAdapter) as exc:
        # The request or the declaration is wrong, not the model: the client is told why.
        worker.failed += 1
        worker.send(error_header(h["id"], "bad_request", str(exc)))
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

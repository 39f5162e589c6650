"""The worker's `text` op: completions, chats, tokenize, detokenize and tokenizer info on the
serving version, on the serving thread (so a reload's drain and swap order it like any
forward), answered with the version and digest that computed it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import CANCELLED, PARTIAL
from hotreload.worker.adapters import BASE, UnknownAdapter, choose
from hotreload.worker.generate import (
    CANCEL_FLAG,
    STREAM_TO,
    ModelCall,
    NotAGenerator,
    Sampling,
    StreamCancelled,
    TextHook,
    TextRequestError,
    check_prompts,
    complete,
    prompt_bound,
    prompt_field,
)
from hotreload.worker.load_error import LoadError
from hotreload.worker.replies import error_header
from hotreload.worker.text_tokenizer import (
    ChatTemplateError,
    Tokenizer,
    TokenizerError,
    tokenizer_for,
)

if TYPE_CHECKING:
    from hotreload.worker.loader import ModelVersion


class ServingWorker(Protocol):
    """What the op reads and counts on the worker (worker/server.py's `Worker`)."""

    spec: dict[str, Any]
    served: int
    failed: int
    busy_since: float | None
    busy_total: float
    streams: dict[Any, threading.Event]
    cancelled: int

    def admit(self, h: dict[str, Any]) -> ModelVersion | None: ...

    def send(self, header: dict[str, Any], blobs: list[Any] | None = None) -> None: ...


#: How long an answer waits for a just-swapped version's weights digest.
DIGEST_WAIT_S = 60.0
#: A stream's text goes out at most this often after its first token (which goes at once):
#: the tokens made meanwhile go together. Each frame costs the session and the client a
#: wake-up and a parse (a quarter of a millisecond each, on a 2-core machine): a frame per
#: token streamed a 0.7 ms-a-token model at 0.81x its in-process decode loop, grouped at
#: 0.99x (benchmarks/streaming.py --size tiny).
STREAM_FRAME_S = 0.01


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
    param = field.split("'")[1] if field.count("'") >= 2 else None  # `'prompt'[1]`: prompt
    if tokenized:
        raise TextRequestError(
            f"the tokenizer turned {field} into token id {bad}, past the model's vocabulary "
            f"of {vocab} ids: the model's tokenizer does not match its weights",
            param,
        )
    raise TextRequestError(
        f"{field} holds token id {bad}, past the model's vocabulary: token ids go from 0 to "
        f"{vocab - 1}",
        param,
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


#: torch's seeds are 64-bit: `manual_seed(-1)` draws as `manual_seed(2**64 - 1)` does.
_SEED_SPAN = 1 << 64
#: New tokens a request without `max_tokens` may make when no config or tokenizer states
#: the model's context (with one, the rest of the context: vLLM's default).
UNBOUNDED_MAX_TOKENS = 1024


def _chat_text(tok: Tokenizer, req: dict[str, Any]) -> str:
    """The prompt text the chat template renders of the request's messages."""
    try:
        return tok.chat_prompt(req["messages"], bool(req.get("add_generation_prompt", True)))
    except ChatTemplateError as exc:
        raise TextRequestError(str(exc), "messages") from None


def _encode(tok: Tokenizer, text: str, special: bool | None, field: str) -> list[int]:
    """`text`'s ids. A string no UTF-8 tokenizer can take (a lone surrogate the front let
    through, or one a chat template wrote) is the request's 400, naming `field`, never a
    model error."""
    try:
        # Looked at first: a fast (Rust) tokenizer raises TypeError on a surrogate, not
        # UnicodeEncodeError, and a TypeError is not the request's to answer.
        text.encode("utf-8")
        return tok.encode(text, special)
    except UnicodeEncodeError as exc:
        raise TextRequestError(
            f"'{field}' holds a character the tokenizer cannot encode "
            f"(U+{ord(exc.object[exc.start]):04X} at character {exc.start}: a lone surrogate "
            "is not text): send valid Unicode (a surrogate pair, or the character itself)",
            field,
        ) from None


def _special(req: dict[str, Any], chat: bool) -> bool | None:
    """Whether to add the tokenizer's special tokens: as the request says, else vLLM's
    default: a chat's rendered text gets none (its template wrote them), a string prompt
    the tokenizer's own default (None)."""
    said = req.get("add_special_tokens")
    if said is not None:
        return bool(said)
    return False if chat else None


def _prompt_ids(tok: Tokenizer, req: dict[str, Any]) -> tuple[list[list[int]], list[bool]]:
    """Each prompt's token ids, and whether the tokenizer made them (rather than the client)."""
    if req.get("task") == "chat":
        return [_encode(tok, _chat_text(tok, req), _special(req, chat=True), "messages")], [True]
    special = _special(req, chat=False)
    field = str(req.get("field") or "prompt")
    ids = [
        _encode(tok, p, special, field) if isinstance(p, str) else [int(i) for i in p]
        for p in req["prompts"]
    ]
    return ids, [isinstance(p, str) for p in req["prompts"]]


def _default_max_tokens(call: ModelCall, tok: Tokenizer, prompts: list[list[int]]) -> int:
    """`max_tokens` left out (a chat client's default): the rest of the context after the
    longest prompt, at least 1 (a prompt filling the context is then refused by
    check_prompts, naming the context)."""
    bound = prompt_bound(call, tok)
    if bound is None:
        return UNBOUNDED_MAX_TOKENS
    return max(1, bound[0] - max(len(p) for p in prompts))


def _choice_seed(seed: int | None, k: int) -> int | None:
    """Choice k's seed: seed + k (so choice 0 is the answer n=1 gives), modulo 2**64 as
    torch reads a seed (so it stays in the range `manual_seed` takes)."""
    if seed is None:
        return None
    return seed + k if k == 0 else (seed + k) % _SEED_SPAN


def run_text(mv: ModelVersion, spec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """One text request's reply fields (without id, version, digest)."""
    call, tok = _prepared(mv, spec.get("tokenizer"))
    _choose_adapter(mv, spec, req.get("adapter"))
    task = req.get("task")
    if task == "tokenize":
        if "messages" in req:
            text = _chat_text(tok, req)
            return {"tokens": _encode(tok, text, _special(req, chat=True), "messages")}
        return {"tokens": _encode(tok, str(req["prompt"]), _special(req, chat=False), "prompt")}
    if task == "detokenize":
        tokens = [int(i) for i in req["tokens"]]
        _check_ids(tokens, _vocab_size(mv, call), "'tokens'", tokenized=False)
        return {"prompt": tok.decode(tokens)}
    if task == "info":
        return {"info": {**tok.info, "source": tok.source}}
    # Every prompt is measured before any runs: one over the bound is a 400 at once.
    prompts, tokenized = _prompt_ids(tok, req)
    vocab, name = _vocab_size(mv, call), str(req.get("field") or "prompt")
    for i, (ids, made) in enumerate(zip(prompts, tokenized, strict=True)):
        _check_ids(ids, vocab, prompt_field(i, len(prompts), name), tokenized=made)
    asked = dict(req["sampling"])
    if asked.get("max_tokens") is None:
        asked["max_tokens"] = _default_max_tokens(call, tok, prompts)
    sampling = Sampling(**asked)
    max_prompt = spec.get("max_prompt_tokens")
    check_prompts(call, tok, prompts, sampling.max_tokens, max_prompt, name)
    n = int(req.get("n") or 1)
    choices, prompt_tokens, completion_tokens = [], 0, 0
    first_token_s: float | None = None
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            c = None
            for k in range(n):
                # Greedy choices are one answer n times: decoded once.
                if c is None or sampling.temperature > 0:
                    s = replace(sampling, seed=_choice_seed(sampling.seed, k))
                    c = complete(call, tok, ids, s, mv.device)
                if first_token_s is None and c.first_token_s is not None:
                    first_token_s = time.perf_counter() - t0
                # OpenAI's order: prompt i's n choices, then prompt i + 1's.
                choices.append(
                    {
                        "index": i * n + k,
                        "text": c.text,
                        "logprobs": c.logprobs,
                        "finish_reason": c.finish_reason,
                    }
                )
                completion_tokens += c.completion_tokens
            prompt_tokens += len(ids)
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
    a forward (build pacing sees generation as serving work). A streamed request (`stream`
    in its text request) sends its text as it is made (`_Stream`), then the reply. Any
    text request stops at its next token once a CANCEL sets its flag (its client went
    away, or its deadline passed: engine/router.py sends it)."""
    h = frame.header
    flag = worker.streams.get(h["id"])  # registered by the reader thread on arrival
    try:
        _answer_text(worker, h, flag)
    finally:
        if flag is not None:
            worker.streams.pop(h["id"], None)


def _answer_text(worker: ServingWorker, h: dict[str, Any], flag: threading.Event | None) -> None:
    mv = worker.admit(h)
    if mv is None:
        return
    t0 = time.perf_counter()
    req = h.get("text") or {}
    streamed = flag is not None and bool(req.get("stream"))
    stream = _Stream(worker, h["id"], mv, flag, req) if streamed and flag is not None else None
    opened = STREAM_TO.set(stream.open if stream is not None else None)
    watched = CANCEL_FLAG.set(flag)
    try:
        if flag is not None and flag.is_set():
            raise StreamCancelled("cancelled before it started")
        fields = run_text(mv, worker.spec, req)
        if stream is not None:
            stream.finish()
    except StreamCancelled as exc:
        worker.cancelled += 1
        kind = "stream cancelled" if streamed else "cancelled"
        worker.send(error_header(h["id"], CANCELLED, f"{kind}: {exc}"))
        return
    except (NotAGenerator, TokenizerError, TextRequestError, LoadError) as exc:
        # The request or the declaration is wrong, not the model: the client is told why.
        # An adapter left out at a restart (AdapterUnavailable) carries its own code: 503.
        worker.failed += 1
        # The request field at fault, when one is (a prompt past the context).
        param = getattr(exc, "param", None)
        extra = {"param": param} if param else {}
        code = getattr(exc, "code", "bad_request")
        worker.send(error_header(h["id"], code, str(exc), **extra))
        return
    except BaseException:
        worker.failed += 1
        raise
    finally:
        CANCEL_FLAG.reset(watched)
        STREAM_TO.reset(opened)
        worker.busy_total += time.monotonic() - worker.busy_since
        worker.busy_since = None
    worker.served += 1
    worker.send(
        {
            "id": h["id"],
            "ok": True,
            "version": mv.version,
            "digest": _digest(mv),
            "compute_ms": (time.perf_counter() - t0) * 1000,
            **fields,
        }
    )


def _digest(mv: ModelVersion) -> str | None:
    digest = mv.digest
    if digest is None and mv.digest_future is not None:
        # Just swapped in, still hashing (a ~1 GiB model: ~0.5 s): an eval's answer must
        # name its weights, so it waits for the digest rather than say null.
        digest = mv.digest_future.result(timeout=DIGEST_WAIT_S)
    return digest


class _Stream:
    """A streamed request's sender: one `PARTIAL` frame per token that adds text, naming
    the version and digest that wrote it, with the log-probabilities of the tokens made
    since the last frame when the request asked for them (a token that ends inside a
    character waits for the text it makes); the request's CANCEL flag is read at every
    token."""

    def __init__(
        self,
        worker: ServingWorker,
        rid: Any,
        mv: ModelVersion,
        flag: threading.Event,
        req: dict[str, Any],
    ) -> None:
        self.worker, self.rid, self.mv, self.flag = worker, rid, mv, flag
        self.n = int(req.get("n") or 1)
        # run_text decodes a greedy request's n choices of one prompt once: that decode
        # is all n of them (choice index = prompt * n + k, OpenAI's order).
        self.shared = float((req.get("sampling") or {}).get("temperature", 1.0)) <= 0
        self.calls = 0
        self.made = 0
        self._head: dict[str, Any] | None = None
        #: When the last frame went (0: none yet, the first goes at once).
        self._sent_at = 0.0
        #: Sends what the current choice holds back (its next choice calls it).
        self._flush: Callable[[], None] | None = None

    def open(self) -> TextHook:
        """The hook of the next `complete` call (generate.STREAM_TO), in run_text's order.
        The choice before has ended: its text held back for grouping goes now."""
        if self._flush is not None:
            self._flush()
        call, self.calls = self.calls, self.calls + 1
        first, count = (call * self.n, self.n) if self.shared else (call, 1)
        indexes = range(first, first + count)
        sent = latest = ""
        pending: dict[str, list[Any]] | None = None

        def send() -> None:
            nonlocal sent, pending
            if len(latest) <= len(sent):
                return  # nothing new settled (a character or a stop string half made)
            # `latest` extends `sent` (generate.complete sends what two decodes agree on),
            # unless a decode rewrote text further back than one token: sent text cannot
            # be taken back, so the stream goes on past its length rather than stop there
            # (the client's text then differs from the answer only where it was rewritten).
            self._sent_at = time.perf_counter()
            delta, sent = latest[len(sent) :], latest
            more = {"logprobs": pending} if pending is not None else {}
            pending = None
            choices = [{"index": i, "text": delta, **more} for i in indexes]
            self.worker.send({**self.head(), "choices": choices})

        def show(text: str, logprobs: dict[str, list[Any]] | None) -> None:
            nonlocal latest, pending
            self.made += 1
            if self.flag.is_set():
                raise StreamCancelled(f"stopped after {self.made} token(s)")
            if logprobs is not None:
                if pending is None:
                    pending = logprobs
                else:
                    pending = {k: pending[k] + logprobs[k] for k in pending}
            latest = text
            if time.perf_counter() - self._sent_at >= STREAM_FRAME_S:
                send()  # else it goes with a later token's frame, or the reply

        self._flush = send
        return show

    def finish(self) -> None:
        """The last choice has ended: its text held back for grouping goes before the
        reply, so the pieces add up to the answer (its last token's text was held back to
        the end: generate.complete)."""
        if self._flush is not None:
            self._flush()
            self._flush = None

    def head(self) -> dict[str, Any]:
        if self._head is None:  # the digest once, at the first token (not before prefill)
            mv = self.mv
            self._head = {
                "id": self.rid,
                "ok": True,
                PARTIAL: True,
                "version": mv.version,
                "digest": _digest(mv),
            }
        return self._head

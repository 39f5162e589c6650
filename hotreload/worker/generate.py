"""Scoring and generation for a causal LM, in the worker: what `/v1/completions` computes.

One forward over the whole prompt (for an eval harness: context + continuation) gives every
prompt token's log-probability (`echo`) and the logits of the first new token; the decode
loop then feeds one token at a time with the model's KV cache when its forward takes one
(`past_key_values`, or `cache` as transformers 5 spells it), else the whole sequence again.
Greedy at temperature 0, so the tokens are the ones `argmax` picks in-process.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from hotreload.worker.text_tokenizer import Tokenizer

#: Keywords a forward may take its KV cache by, and the output attributes it comes back in.
_CACHE_KWARGS = ("past_key_values", "cache")
#: Config fields that hold how many positions a causal LM attends over, first found wins
#: (the ones vLLM reads; GPT-2's own first, so the message names the key its config holds).
_CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "max_seq_len", "seq_length", "n_ctx")
#: RoPE scalings that stretch the context by their `factor` (vLLM's rule; llama3 and
#: longrope configs state the stretched length already).
_STRETCHING_ROPE = ("linear", "dynamic", "yarn")
#: A tokenizer's `model_max_length` above this is transformers' "no limit" placeholder (1e30,
#: clamped) or a guess, not a context length.
_SENSIBLE_MAX_LENGTH = 10_000_000


class NotAGenerator(ValueError):
    """The model cannot serve text routes (its output has no logits); answered as a 400."""


class TextRequestError(ValueError):
    """A text request the model cannot answer as sent (an empty prompt); a 400. `param`:
    the request field at fault, when one is (OpenAI's error object names it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class StreamCancelled(Exception):
    """A text request was told to stop (its client went away, its timeout passed, or a
    reload ended it): raised at a token, it ends the decode loop there."""


#: Gets each new token's text so far, and the log-probabilities of the tokens made since
#: its last call (OpenAI's legacy shape, as `Completion.logprobs`; None when the request
#: asked for none, or no token was made since).
TextHook = Callable[[str, "dict[str, Any] | None"], None]
#: Set by the `text` op for a streamed request (worker/text_op.py): each `complete` call
#: (one choice, in answer order) takes from it the hook its text goes to, token by token. A
#: context variable, so the prompt-side code between the op and the decode loop passes
#: nothing along, and a request that does not stream pays one lookup per choice.
STREAM_TO: ContextVar[Callable[[], TextHook] | None] = ContextVar("stream_to", default=None)
#: Set by the `text` op to the request's CANCEL flag (worker/text_op.py): the decode loop
#: looks at it before each token, so a request nobody waits for any more (its client gone,
#: its deadline passed) stops there rather than at its max_tokens.
CANCEL_FLAG: ContextVar[threading.Event | None] = ContextVar("cancel_flag", default=None)


@dataclass
class ModelCall:
    """How to call one model for logits: by `input_ids=` or positionally, with which cache
    keyword (None: no cache, the loop re-runs the sequence)."""

    model: Any
    by_keyword: bool
    cache_kw: str | None
    #: How many tokens (prompt and completion) the model attends over, and where that was
    #: read (for the message); None: its config does not say.
    context: tuple[int, str] | None = None
    #: The end-of-text ids of the model's generation config (`eos_token_id`: one or a
    #: list, as Llama-3 instruct's `<|eot_id|>` beside `<|end_of_text|>`): decoding stops
    #: at any of them, and at the tokenizer's, as vLLM's does.
    eos_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, model: Any) -> ModelCall:
        fn = getattr(model, "forward", model)
        context, eos = model_context(model), generation_eos_ids(model)
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return cls(model, False, None, context, eos)
        cache_kw = next((k for k in _CACHE_KWARGS if k in params), None)
        return cls(model, "input_ids" in params, cache_kw, context, eos)

    def __call__(self, ids: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
        """Logits [1, len, vocab] for `ids` [1, len] (the new tokens when `cache` holds the
        earlier ones), and the cache to pass next time."""
        kwargs: dict[str, Any] = {}
        if self.cache_kw is not None:
            kwargs["use_cache"] = True
            if cache is not None:
                kwargs[self.cache_kw] = cache
        out = self.model(input_ids=ids, **kwargs) if self.by_keyword else self.model(ids)
        logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if logits is None and isinstance(out, dict):
            logits = out.get("logits")
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            got = type(out).__name__
            raise NotAGenerator(
                f"the model's forward returned {got}, not logits: a text generator's forward "
                "takes input_ids [batch, length] and returns logits [batch, length, vocab] "
                "(a tensor, or an output with .logits)"
            )
        new_cache = None
        if self.cache_kw is not None:
            new_cache = next(
                (getattr(out, k) for k in _CACHE_KWARGS if getattr(out, k, None) is not None),
                None,
            )
        return logits, new_cache


def _config_context(config: Any) -> tuple[int, str] | None:
    for key in _CONTEXT_KEYS:
        n = getattr(config, key, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            break
    else:
        return None
    where = f"{key} in its config"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and isinstance(rope.get("factor"), (int, float)):
        kind = rope.get("rope_type", rope.get("type"))
        if kind in _STRETCHING_ROPE and rope["factor"] > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            base = base if isinstance(base, int) and base > 0 else n
            n = int(base * rope["factor"])
            where = f"{where}, times its {kind} RoPE factor {rope['factor']:g}"
    return n, where


def model_context(model: Any) -> tuple[int, str] | None:
    """The context length of a Hugging Face style model: its own `config`, or that of the
    first submodule with one (a module wrapping a transformers model, as
    examples/tiny_lm does), with where it was read. None: no config says."""
    found = _config_context(getattr(model, "config", None))
    if found is not None or not callable(getattr(model, "modules", None)):
        return found
    for sub in model.modules():
        found = _config_context(getattr(sub, "config", None))
        if found is not None:
            return found
    return None


def _eos_of(config: Any) -> frozenset[int] | None:
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int) and not isinstance(eos, bool):
        return frozenset({eos})
    if isinstance(eos, (list, tuple)) and eos:
        return frozenset(i for i in eos if isinstance(i, int) and not isinstance(i, bool))
    return None


def generation_eos_ids(model: Any) -> frozenset[int]:
    """The end-of-text ids of a Hugging Face style model's `generation_config` (read from
    its generation_config.json), or of the first submodule's with one (a module wrapping a
    transformers model); empty when none says."""
    found = _eos_of(getattr(model, "generation_config", None))
    if found is not None or not callable(getattr(model, "modules", None)):
        return found or frozenset()
    for sub in model.modules():
        found = _eos_of(getattr(sub, "generation_config", None))
        if found is not None:
            return found
    return frozenset()


def prompt_bound(call: ModelCall, tok: Tokenizer) -> tuple[int, str] | None:
    """The context a request must fit: the model config's, else the tokenizer's
    `model_max_length` when it is one (not transformers' 1e30 placeholder)."""
    if call.context is not None:
        return call.context
    n = tok.info.get("model_max_length")
    if isinstance(n, int) and 0 < n <= _SENSIBLE_MAX_LENGTH:
        return n, f"model_max_length of its tokenizer ({tok.source})"
    return None


def prompt_field(index: int, count: int, name: str = "prompt") -> str:
    """How a 400 names prompt `index` of `count`: `'prompt'`, or `'prompt'[i]` in a batch
    (`name`: the route's field, `text_input` on Triton's generate)."""
    return f"'{name}'[{index}]" if count > 1 else f"'{name}'"


def check_prompts(
    call: ModelCall,
    tok: Tokenizer,
    prompts: list[list[int]],
    max_tokens: int,
    max_prompt_tokens: int | None,
    field_name: str = "prompt",
) -> None:
    """Refuse, before any forward, a request that does not fit: a prompt over the model's
    `max_prompt_tokens` key, or prompt + `max_tokens` over the model's context (vLLM's rule
    and wording). Past the context a model with learned positions fails (on a GPU, with a
    device-side assert that ruins the worker's CUDA context); one with rotary positions
    runs a quadratic forward for as long as the prompt is (200k tokens: a minute).

    The prompts come tokenized whole: no count of characters bounds the tokens (a character
    can be several byte-level tokens, a normalizer can drop characters), and a fast
    tokenizer truncating at the bound still encodes it all. The 1 MiB request header bounds
    that work (200k characters: 0.01 s byte-level, 0.1 s BPE), linear where the forward it
    spares is quadratic."""
    context = prompt_bound(call, tok)
    for i, ids in enumerate(prompts):
        field = prompt_field(i, len(prompts), field_name)
        n = len(ids)
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            raise TextRequestError(
                f"{field} has {n} tokens, over this model's limit of {max_prompt_tokens} "
                "(max_prompt_tokens in its [[models]] table); shorten the prompt",
                field_name,
            )
        if context is not None and n + max_tokens > context[0]:
            raise TextRequestError(
                f"{field}: this model's maximum context length is {context[0]} tokens "
                f"({context[1]}). However, you requested {n + max_tokens} tokens ({n} in the "
                f"prompt, {max_tokens} in the completion). Please reduce the length of the "
                "prompt or 'max_tokens'",
                field_name,
            )


@dataclass
class Sampling:
    """A request's decoding settings (validated by the HTTP front)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    echo: bool = False
    #: The answer's text leaves out the special tokens generated (vLLM's default); the
    #: echoed prompt and the log-probabilities' tokens keep theirs (what lm-eval reads).
    skip_special_tokens: bool = True


@dataclass
class Completion:
    """One prompt's answer: the legacy completions choice, before JSON."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: dict[str, Any] | None
    #: Seconds from the start of this prompt to its first new token (None: none made).
    first_token_s: float | None


def _top(lp: torch.Tensor, k: int, tok: Tokenizer) -> dict[str, float]:
    values, ids = torch.topk(lp, k)
    top: dict[str, float] = {}
    for v, i in zip(values.tolist(), ids.tolist(), strict=True):
        top.setdefault(tok.decode([i]), v)  # two ids with one text: the likelier stays
    return top


def _pick(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> int:
    if s.temperature <= 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < s.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen).item())


def complete(
    call: ModelCall,
    tok: Tokenizer,
    prompt_ids: list[int],
    s: Sampling,
    device: torch.device,
) -> Completion:
    """Score the prompt and continue it by up to `s.max_tokens` tokens."""
    if not prompt_ids:
        raise TextRequestError("the prompt is empty after tokenization; send at least one token")
    t0 = time.perf_counter()
    cancel = CANCEL_FLAG.get()
    stop_ids = call.eos_ids | ({tok.eos_id} if tok.eos_id is not None else frozenset())
    opened = STREAM_TO.get()
    show = opened() if opened is not None else None
    shown = tok.decode(prompt_ids) if show is not None and s.echo else ""  # echo: the prompt
    lp = _Logprobs(tok, s, prompt_ids) if s.logprobs is not None else None
    gen = None
    if s.temperature > 0 and s.seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(s.seed))
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    logits, cache = call(ids)
    tokens_out: list[int] = []
    eos_made = False
    if lp is not None and s.echo:
        lp.add_prompt(prompt_ids, logits[0].float().log_softmax(-1))
    last = logits[0, -1].float()
    finish = "length"
    first_token_s = None
    text = ""
    for _ in range(s.max_tokens):
        if cancel is not None and cancel.is_set():
            raise StreamCancelled(f"stopped after {len(tokens_out)} token(s)")
        nxt = _pick(last, s, gen)
        if first_token_s is None:
            first_token_s = time.perf_counter() - t0
        if lp is not None:
            # Every new token is scored, the end-of-text one too: lm-eval reads the prompt's
            # log-probabilities as all but the last entry (it asks for max_tokens=1).
            row = last.log_softmax(-1)
            lp.add(nxt, float(row[nxt]), row)
        if nxt in stop_ids:
            finish = "stop"
            eos_made = True
            break
        tokens_out.append(nxt)
        before, text = text, tok.decode(tokens_out, skip_special=s.skip_special_tokens)
        cut = min((text.find(x) for x in s.stop if x and x in text), default=-1)
        if cut >= 0:
            text = text[:cut]
            finish = "stop"
            break
        if show is not None:  # streamed: the text no later token can change, so far
            # Where a decode may rewrite the text at its boundary once the next token
            # comes (clean_up_tokenization_spaces: "I '" then "s" decodes "I's"), the
            # newest token's text is held back to the next one: only what two decodes
            # agree on goes. Else it goes at once (the first token's text too).
            sure = text if tok.decode_extends else _agreed(before, text)
            show(shown + settled(sure, s.stop), lp.new() if lp is not None else None)
        if len(tokens_out) == s.max_tokens:
            break
        if call.cache_kw is not None and cache is not None:
            logits, cache = call(torch.tensor([[nxt]], dtype=torch.long, device=device), cache)
        else:
            whole = torch.tensor([prompt_ids + tokens_out], dtype=torch.long, device=device)
            logits, cache = call(whole)
        last = logits[0, -1].float()
    made = len(tokens_out) + eos_made  # the end-of-text token counts
    if show is not None and tokens_out:
        # The answer is whole: what was held back (the newest token's text) goes now, so
        # the stream's pieces add up to it rather than leave its end to the reply.
        show(shown + text, lp.new() if lp is not None else None)
    logprobs = lp.doc if lp is not None else None
    if s.echo:
        text = tok.decode(prompt_ids) + text
    return Completion(text, finish, len(prompt_ids), made, logprobs, first_token_s)


def _agreed(before: str, now: str) -> str:
    """The longest start `before` (the decode without the newest token) and `now` share."""
    if now.startswith(before):
        return before
    n = 0
    for a, b in zip(before, now, strict=False):
        if a != b:
            break
        n += 1
    return now[:n]


def settled(text: str, stops: list[str]) -> str:
    """What of `text` a stream may send now: not a trailing U+FFFD (the start of a
    character the next byte-level token completes), nor a tail that may be the start of a
    stop string (cut from the answer if the next tokens complete it). The rest comes with
    the final reply, so a stream's pieces add up to the answer not streamed."""
    end = len(text.rstrip("\ufffd"))
    held = 0
    for x in stops:
        for k in range(min(len(x) - 1, end), held, -1):
            if text.startswith(x[:k], end - k):
                held = k
                break
    return text[: end - held]


class _Logprobs:
    """OpenAI's legacy `choices[].logprobs`, built a token at a time (a stream sends each
    token's with its text): `tokens` (each one's text), `token_logprobs`, `top_logprobs`
    (text -> value, the top k), `text_offset` (each token's character offset in the prompt
    + answer text). Echoed, the prompt's tokens come first; the first has no
    log-probability (null)."""

    def __init__(self, tok: Tokenizer, s: Sampling, prompt_ids: list[int]) -> None:
        self.tok, self.k = tok, int(s.logprobs or 0)
        self.doc: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        self.offset = 0 if s.echo else len(tok.decode(prompt_ids))
        #: How many tokens `new()` has handed out.
        self.given = 0

    def add(self, t: int, value: float | None, row: torch.Tensor | None) -> None:
        """Token `t`, its log-probability and the log-softmax row it was picked from."""
        text = self.tok.decode([t])
        d = self.doc
        d["tokens"].append(text)
        d["token_logprobs"].append(value)
        d["top_logprobs"].append(None if row is None else self._top(row))
        d["text_offset"].append(self.offset)
        self.offset += len(text)

    def add_prompt(self, prompt_ids: list[int], rows: torch.Tensor) -> None:
        """The prompt's tokens (echo): row i of `rows` scores token i + 1."""
        self.add(prompt_ids[0], None, None)
        targets = torch.tensor(prompt_ids[1:], dtype=torch.long, device=rows.device)
        picked = rows[:-1].gather(1, targets[:, None])[:, 0].tolist()  # one gather for all
        for i, (t, value) in enumerate(zip(prompt_ids[1:], picked, strict=True)):
            self.add(t, value, rows[i])

    def _top(self, row: torch.Tensor) -> dict[str, float]:
        return _top(row, self.k, self.tok) if self.k > 0 else {}

    def new(self) -> dict[str, list[Any]] | None:
        """The tokens added since the last call, in the same shape (None: none)."""
        n = len(self.doc["tokens"])
        if n == self.given:
            return None
        part = {key: values[self.given :] for key, values in self.doc.items()}
        self.given = n
        return part

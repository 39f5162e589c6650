"""The tokenizer of a text-generating model, in the worker: a `save_pretrained` folder read
with transformers from local files only, or the model module's own `encode`/`decode`.

One interface for both, so the completions code never asks which it has. A folder's
tokenizer is read once per folder and file state (a code edit does not re-read it); a
module's functions come from the version that serves, so an edit of `encode` goes live
with that version.

Special tokens follow vLLM: a string is encoded with the tokenizer's own default (a
Hugging Face tokenizer adds its BOS, as `tokenizer(text)` does) unless the request says
otherwise. A chat is rendered to text by the chat template (the folder's `chat_template`,
or `CHAT_TEMPLATE` in the module), which writes any special tokens itself.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """The model has no usable tokenizer; the message says what to declare."""


class ChatTemplateError(ValueError):
    """The chat template refused the request's messages (its `raise_exception`, or a
    message it cannot render); answered as a 400."""


#: Renders a chat (OpenAI-style messages) to the prompt text: (messages, add_generation_prompt).
ChatRenderer = Callable[[list[dict[str, Any]], bool], str]


@dataclass(eq=False)
class Tokenizer:
    """encode/decode and the special tokens, whichever kind backs them."""

    _encode: Callable[..., Any]
    _decode: Callable[[list[int]], str]
    takes_special: bool
    eos_id: int | None
    bos_id: int | None
    #: What `/tokenizer_info` answers (lm-eval's remote tokenizer reads eos/bos/pad).
    info: dict[str, Any]
    #: Where it came from, for messages: a folder or "module <name>".
    source: str
    #: The chat template's renderer; None: the tokenizer declares no template.
    _render_chat: ChatRenderer | None = None
    #: Decodes leaving out the special tokens (a Hugging Face tokenizer's
    #: `decode(ids, skip_special_tokens=True)`); None: drop `special_ids`, then decode.
    _decode_skipping: Callable[[list[int]], str] | None = None
    #: The ids `decode(skip_special=True)` leaves out when the tokenizer cannot itself.
    special_ids: frozenset[int] = frozenset()
    #: Decoding one more token only appends to the text (no clean-up pass that rewrites
    #: what came before it, as `clean_up_tokenization_spaces` turns "I '" + "s" into
    #: "I's"): a stream may then send each token's text at once. False where unknown (a
    #: module's own decode): a stream holds the newest token's text back to the next one.
    decode_extends: bool = False

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """`text`'s ids; `add_special_tokens` None: the tokenizer's own default (a Hugging
        Face tokenizer's `tokenizer(text)`, or the default of the module's `encode`)."""
        if self.takes_special and add_special_tokens is not None:
            ids = self._encode(text, add_special_tokens=add_special_tokens)
        else:
            ids = self._encode(text)
        return [int(i) for i in ids]

    @property
    def has_chat_template(self) -> bool:
        return self._render_chat is not None

    def chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The prompt text the chat template makes of `messages`. TokenizerError when there
        is no template (the message says how to declare one), ChatTemplateError when the
        template refuses the messages."""
        if self._render_chat is None:
            raise TokenizerError(
                f"the model's tokenizer ({self.source}) has no chat template, so "
                "/v1/chat/completions cannot turn messages into a prompt. Declare one: for a "
                "save_pretrained folder, set tokenizer.chat_template = '<Jinja template>' and "
                "call tokenizer.save_pretrained(folder) again (it writes chat_template.jinja); "
                "for encode/decode in the model's module, define CHAT_TEMPLATE = '<Jinja "
                "template>' beside them (it reads `messages` and `add_generation_prompt`, as "
                "a Hugging Face template does). Or render the prompt yourself and send it to "
                "/v1/completions"
            )
        try:
            return str(self._render_chat(messages, add_generation_prompt))
        except TokenizerError:
            raise
        except Exception as exc:
            # A template is the model's code, run on the client's messages: whatever it
            # raises (its raise_exception, a role it does not know) is this request's 400.
            raise ChatTemplateError(
                f"'messages': the chat template of {self.source} refused them: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """`ids`' text; `skip_special`: without the special tokens (vLLM's
        `skip_special_tokens`, for a generated answer)."""
        if not skip_special:
            return str(self._decode(list(ids)))
        if self._decode_skipping is not None:
            return str(self._decode_skipping(list(ids)))
        return str(self._decode([i for i in ids if i not in self.special_ids]))


_folder_cache: dict[str, tuple[tuple[Any, ...], Tokenizer]] = {}
_folder_lock = threading.Lock()


def _folder_state(folder: Path) -> tuple[Any, ...]:
    return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()))


def from_folder(folder: Path) -> Tokenizer:
    """A transformers tokenizer from a `save_pretrained` folder, no network."""
    if not folder.is_dir():
        raise TokenizerError(
            f"tokenizer folder {folder} does not exist; point `tokenizer` in the model's "
            "[[models]] table at a folder written by tokenizer.save_pretrained()"
        )
    key = str(folder)
    state = _folder_state(folder)
    with _folder_lock:
        cached = _folder_cache.get(key)
        if cached is not None and cached[0] == state:
            return cached[1]
        try:
            from transformers import AutoTokenizer

            # Never the Hub: the folder is all there is.
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:
            raise TokenizerError(
                f"cannot read the tokenizer in {folder}: {type(exc).__name__}: {exc}"
            ) from exc
        info = {
            "eos_token": tok.eos_token,
            "bos_token": tok.bos_token,
            "pad_token": tok.pad_token,
            "chat_template": getattr(tok, "chat_template", None),
            "model_max_length": min(int(tok.model_max_length), 2**31 - 1),
            "tokenizer_class": type(tok).__name__,
        }
        made = Tokenizer(
            lambda text, add_special_tokens=True: (
                tok(text, add_special_tokens=add_special_tokens).input_ids
            ),
            tok.decode,
            takes_special=True,
            eos_id=tok.eos_token_id,
            bos_id=tok.bos_token_id,
            info=info,
            source=str(folder),
            _render_chat=_hf_renderer(tok) if info["chat_template"] else None,
            _decode_skipping=lambda ids: tok.decode(ids, skip_special_tokens=True),
            decode_extends=_decode_extends(tok),
        )
        _folder_cache[key] = (state, made)
        return made


def _decode_extends(tok: Any) -> bool:
    """Whether a Hugging Face tokenizer's decode only appends as tokens come: a `tokenizers`
    backend with no clean-up pass and no byte fallback. Byte fallback (Llama 2, Mistral,
    Gemma) decodes a run of `<0xNN>` tokens as one: "0" (`<0x30>`) becomes two U+FFFD once
    `<0xB2>` follows, rewriting text sent. A Python tokenizer's `convert_tokens_to_string`
    may do anything: unknown, so held back too."""
    if getattr(tok, "clean_up_tokenization_spaces", False):
        return False
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = backend.decoder
    if decoder is None:
        return True
    return "ByteFallback" not in _decoder_types(json.loads(decoder.__getstate__()))


def _decoder_types(doc: dict[str, Any]) -> set[str]:
    """A `tokenizers` decoder's type and those of the decoders a Sequence holds."""
    types = {str(doc.get("type"))}
    for inner in doc.get("decoders") or ():
        types |= _decoder_types(inner)
    return types


def _hf_renderer(tok: Any) -> ChatRenderer:
    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return str(
            tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    return render


def _raise_exception(message: str) -> None:
    # What Hugging Face templates call to refuse a conversation ("roles must alternate").
    raise ValueError(message)


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """A module's CHAT_TEMPLATE compiled as transformers compiles a tokenizer's: sandboxed,
    blocks trimmed, `raise_exception` and loop controls available."""
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise TokenizerError(
            f"CHAT_TEMPLATE is not a valid Jinja template: {exc.message} (line {exc.lineno})"
        ) from None


def _module_renderer(template: Any, where: str) -> ChatRenderer:
    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        # Checked here, not when the tokenizer is made: a wrong CHAT_TEMPLATE fails chat
        # requests only, and completions keep working.
        if not isinstance(template, str) or not template.strip():
            raise TokenizerError(
                f"CHAT_TEMPLATE in {where} must be a Jinja template (a non-empty string), "
                f"got {type(template).__name__}"
            )
        return str(
            _compiled(template).render(
                messages=messages, add_generation_prompt=add_generation_prompt
            )
        )

    return render


def from_model(model: Any) -> Tokenizer:
    """The `encode`/`decode` of the model object, or else of the module its class is
    defined in (examples/tiny_lm/model.py). `EOS`/`BOS` there name the special ids, and
    `CHAT_TEMPLATE` (a Jinja template, as a Hugging Face tokenizer's `chat_template`:
    it reads `messages` and `add_generation_prompt`) the chat template."""
    module = inspect.getmodule(type(model))
    for owner in (model, module):
        encode = getattr(owner, "encode", None)
        decode = getattr(owner, "decode", None)
        if callable(encode) and callable(decode):
            break
    else:
        where = getattr(module, "__name__", "its module")
        raise TokenizerError(
            f"the model has no tokenizer: define encode(text) -> list[int] and "
            f'decode(ids) -> str in {where}, or set tokenizer = "path/to/folder" (a '
            "save_pretrained folder) in its [[models]] table"
        )
    try:
        takes_special = "add_special_tokens" in inspect.signature(encode).parameters
    except (TypeError, ValueError):
        takes_special = False
    eos = getattr(owner, "EOS", None)
    bos = getattr(owner, "BOS", None)
    eos_id = eos if isinstance(eos, int) else None
    bos_id = bos if isinstance(bos, int) else None
    template = getattr(owner, "CHAT_TEMPLATE", None)
    name = getattr(module, "__name__", "?")
    info = {
        # A module's special tokens have no text lm-eval could encode back to their id.
        "eos_token": None,
        "bos_token": None,
        "pad_token": None,
        "chat_template": template if isinstance(template, str) else None,
        "eos_token_id": eos_id,
        "bos_token_id": bos_id,
        "tokenizer_class": "module encode/decode",
    }
    renderer = None
    if template is not None:
        renderer = _module_renderer(template, f"module {name}")
    return Tokenizer(
        encode,
        decode,
        takes_special=takes_special,
        eos_id=eos_id,
        bos_id=bos_id,
        info=info,
        source=f"module {name}",
        _render_chat=renderer,
        special_ids=frozenset(i for i in (eos_id, bos_id) if i is not None),
    )


def tokenizer_for(model: Any, folder: str | None) -> Tokenizer:
    """The declared tokenizer: the folder when the config names one, else the module's."""
    return from_folder(Path(folder)) if folder else from_model(model)

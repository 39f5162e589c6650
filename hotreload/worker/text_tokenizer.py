"""The tokenizer of a text-generating model, in the worker: a `save_pretrained` folder read
with transformers from local files only, or the model module's own `encode`/`decode`.

One interface for both, so the completions code never asks which it has. A folder's
tokenizer is read once per folder and file state (a code edit does not re-read it); a
module's functions come from the version that serves, so an edit of `encode` goes live
with that version.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """The model has no usable tokenizer; the message says what to declare."""


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

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self.takes_special:
            ids = self._encode(text, add_special_tokens=add_special_tokens)
        else:
            ids = self._encode(text)
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return str(self._decode(list(ids)))


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
            lambda text, add_special_tokens: (
                tok(text, add_special_tokens=add_special_tokens).input_ids
            ),
            tok.decode,
            takes_special=True,
            eos_id=tok.eos_token_id,
            bos_id=tok.bos_token_id,
            info=info,
            source=str(folder),
        )
        _folder_cache[key] = (state, made)
        return made


def from_model(model: Any) -> Tokenizer:
    """The `encode`/`decode` of the model object, or else of the module its class is
    defined in (examples/tiny_lm/model.py). `EOS`/`BOS` there name the special ids."""
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
    info = {
        # A module's special tokens have no text lm-eval could encode back to their id.
        "eos_token": None,
        "bos_token": None,
        "pad_token": None,
        "chat_template": None,
        "eos_token_id": eos_id,
        "bos_token_id": bos_id,
        "tokenizer_class": "module encode/decode",
    }
    name = getattr(module, "__name__", "?")
    return Tokenizer(
        encode,
        decode,
        takes_special=takes_special,
        eos_id=eos_id,
        bos_id=bos_id,
        info=info,
        source=f"module {name}",
    )


def tokenizer_for(model: Any, folder: str | None) -> Tokenizer:
    """The declared tokenizer: the folder when the config names one, else the module's."""
    return from_folder(Path(folder)) if folder else from_model(model)

"""`generator` and `tokenizer` of a model: whether it serves the text routes (OpenAI
completions, `/v2/models/{name}/generate`, `/tokenize`), and what tokenizes for it.

    generator = true            # forward(input_ids) returns logits (or an output with .logits)
    tokenizer = "tokenizer/"    # a save_pretrained folder; left out: the module's encode/decode
    max_prompt_tokens = 4096    # the longest prompt a request may send; left out: the context
"""

from __future__ import annotations

from pathlib import Path

from hotreload.config.checker import Checker


def parse_text(m: Checker, root: Path) -> tuple[bool, Path | None]:
    """(generator, tokenizer folder or None), checked."""
    generator = bool(m.get("generator", bool, False, "true or false"))
    raw = m.get("tokenizer", str, None, "a path to a folder written by save_pretrained")
    if raw is None:
        return generator, None
    if not generator:
        m.fail(
            m.sub("tokenizer"),
            "a tokenizer is only used by a text generator: set generator = true as well "
            "(or remove tokenizer)",
        )
    folder = Path(raw).expanduser()
    folder = folder if folder.is_absolute() else root / folder
    if not folder.is_dir():
        m.fail(
            m.sub("tokenizer"),
            f"folder {folder} does not exist (paths are relative to {root}); write it with "
            "tokenizer.save_pretrained(folder)",
        )
    return generator, folder.resolve()


#: The largest `max_prompt_tokens` taken: no model attends over more, so a larger one is a typo.
MAX_PROMPT_TOKENS_LIMIT = 1 << 30


def parse_max_prompt_tokens(m: Checker, generator: bool) -> int | None:
    """`max_prompt_tokens`, checked: a positive integer, for a text generator only."""
    value = m.get("max_prompt_tokens", int, None, "an integer (tokens)")
    if value is None:
        return None
    if not 1 <= value <= MAX_PROMPT_TOKENS_LIMIT:
        m.fail(
            m.sub("max_prompt_tokens"),
            f"expected an integer between 1 and {MAX_PROMPT_TOKENS_LIMIT}, got {value}",
        )
    if not generator:
        m.fail(
            m.sub("max_prompt_tokens"),
            "max_prompt_tokens bounds a text generator's prompts: set generator = true as "
            "well (or remove max_prompt_tokens)",
        )
    return int(value)

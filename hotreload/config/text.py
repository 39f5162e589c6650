"""`generator` and `tokenizer` of a model: whether it serves the text routes (OpenAI
completions, `/v2/models/{name}/generate`, `/tokenize`), and what tokenizes for it.

    generator = true            # forward(input_ids) returns logits (or an output with .logits)
    tokenizer = "tokenizer/"    # a save_pretrained folder; left out: the module's encode/decode
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

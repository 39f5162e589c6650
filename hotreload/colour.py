"""ANSI colour for terminal output: on for a terminal, off for pipes, files and `NO_COLOR`.

Plain escape codes, no library: the CLI's output must stay cheap to import (`check` never
imports textual, and rich comes with it).
"""

from __future__ import annotations

import os
from typing import TextIO

_CODES = {
    "green": "32",
    "red": "31",
    "bold red": "1;31",
    "yellow": "33",
    "cyan": "36",
    "dim": "2",
    "bold": "1",
}


def wants_colour(stream: TextIO) -> bool:
    """Colour for `stream`: a terminal, unless `NO_COLOR` is set to anything
    (https://no-color.org) or the terminal says it cannot show colour (`TERM=dumb`)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def paint(text: str, style: str | None, enabled: bool) -> str:
    """`text` in `style` (a key of _CODES) when `enabled`, else unchanged."""
    if not enabled or not style or style not in _CODES:
        return text
    return f"\033[{_CODES[style]}m{text}\033[0m"

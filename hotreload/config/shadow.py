"""A `hotreload.toml` found beside a `pyproject.toml` that has `[tool.hotreload]` too: the
first wins, silently until now, so an edit to the other changes nothing. Say so."""

from __future__ import annotations

import functools
import sys
import tomllib
from pathlib import Path


def shadowed_pyproject(config: Path) -> Path | None:
    """The `pyproject.toml` beside `config` (a hotreload.toml) whose `[tool.hotreload]` it
    hides, or None. An unreadable or invalid pyproject hides nothing worth a warning."""
    pyproject = config.parent / "pyproject.toml"
    try:
        raw = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    tool = raw.get("tool")
    return pyproject if isinstance(tool, dict) and "hotreload" in tool else None


@functools.cache
def warn_if_shadowed(config: Path) -> None:
    """Print the warning to stderr once per process (a session reads its config again)."""
    pyproject = shadowed_pyproject(config)
    if pyproject is not None:
        print(
            f"hotreload: warning: using {config}; the [tool.hotreload] table in {pyproject} "
            "is ignored (remove one of them, or pass --config to pick)",
            file=sys.stderr,
        )

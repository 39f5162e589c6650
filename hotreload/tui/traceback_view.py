"""A failed reload's traceback as the dashboard shows it: the user's own line first.

A traceback out of a forward pass is mostly torch (`nn/modules/module.py` twice per layer)
and, above it, hotreload's worker; at 100x30 the user's line was below the fold. So the text
starts with the innermost frame of the user's code and the exception, then the traceback
with hotreload's frames hidden and each run of library frames (site-packages, the standard
library) folded into one line naming them.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field

#: hotreload's installed package folder. Frames are hidden by this path, never by a folder
#: name: a project cloned into a folder called `hotreload` keeps its own frames.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_LIBRARY_DIRS = tuple(
    os.path.normpath(p) + os.sep
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def is_hotreload_frame(filename: str) -> bool:
    """Whether a traceback frame's file belongs to hotreload itself (or importlib)."""
    if filename.startswith("<frozen importlib"):
        return True
    return os.path.isabs(filename) and os.path.normpath(filename).startswith(PACKAGE_DIR)


def is_library_frame(filename: str) -> bool:
    """A frame of an installed package or the standard library, not of the user's project."""
    if filename.startswith("<"):
        return True  # <frozen ...>, <string>: nothing of the user's to open
    path = os.path.normpath(filename)
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(_LIBRARY_DIRS)


@dataclass
class _Frame:
    filename: str
    lines: list[str] = field(default_factory=list)


def _short(filename: str) -> str:
    """`torch/nn/modules/module.py` for a site-packages file: the part a reader knows."""
    parts = os.path.normpath(filename).split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return os.path.basename(filename)


def user_traceback(tb: str) -> str:
    """The traceback with the user's innermost frame and the exception first, hotreload's
    frames hidden and runs of library frames folded (see the module docstring)."""
    lines = tb.rstrip().splitlines()
    head: list[str] = []
    frames: list[_Frame] = []
    tail: list[str] = []
    for line in lines:
        if line.startswith('  File "'):
            frames.append(_Frame(line.split('"')[1], [line]))
        elif frames and line.startswith("    ") and not tail:
            frames[-1].lines.append(line)
        elif frames or tail:
            tail.append(line)
        else:
            head.append(line)
    if not frames:
        return "\n".join(lines)

    user = [f for f in frames if not is_hotreload_frame(f.filename)]
    mine = [f for f in user if not is_library_frame(f.filename)]
    out: list[str] = []
    if mine and len(user) > 1:
        # A one-frame traceback (a syntax error) already starts with it: no repeat.
        out += ["your code, innermost:", *mine[-1].lines, *tail, ""]
    out += head
    hidden = len(frames) - len(user)
    if hidden:
        out.append(f"  ({hidden} hotreload frame(s) hidden)")
    folded: list[_Frame] = []

    def flush() -> None:
        if folded:
            names = ", ".join(dict.fromkeys(_short(f.filename) for f in folded))
            out.append(f"  ... {len(folded)} library frame(s) folded: {names}")
            folded.clear()

    for frame in user:
        if is_library_frame(frame.filename):
            folded.append(frame)
            continue
        flush()
        out += frame.lines
    flush()
    out += tail
    return "\n".join(out)

"""The configuration reference page (docs/configuration.md), written from the config code.

Every key the parser accepts comes from the tuple of known keys its `Checker` is given; its
description is the `#:` comment above the dataclass field that holds it; its default is what
the parser makes of a config that leaves it out. So the page cannot drift from the code:
a key without a `#:` comment fails `render_reference`, and tests/test_docs.py fails when the
committed page differs from what this writes.

    python -m hotreload.config.reference docs/configuration.md
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from hotreload.config import gpu_check, http, loading, models, watch

#: Keys without which the parser refuses a config (`parse_config`, `parse_model`).
_REQUIRED = {("", "models"), ("models", "name"), ("models", "entry"), ("models", "example")}


@dataclass(frozen=True)
class _Table:
    """One table of the config: its TOML header, the dataclass holding it, its known keys."""

    header: str
    path: str
    cls: type
    keys: tuple[str, ...]
    intro: str


#: Top-level tables another part of hotreload reads, with what to say of them.
ELSEWHERE = {
    "ray": "The `[ray]` table, read by `hotreload export ray` alone: replicas, autoscaling, "
    "placement ([Ray Serve](ray.md)).",
}


def _tables() -> tuple[_Table, ...]:
    return (
        _Table("Top level", "", loading.Config, loading._TOP_KEYS, "Keys outside any table."),
        _Table(
            "[[models]]",
            "models",
            models.ModelConfig,
            models.MODEL_KEYS,
            "One table per model served. Paths are relative to the config file.",
        ),
        _Table(
            "[models.deadlines]",
            "models.deadlines",
            models.Deadlines,
            models._DEADLINE_KEYS,
            "Seconds, per model; past one the phase fails and the old version keeps serving.",
        ),
        _Table("[watch]", "watch", watch.WatchConfig, _fields(watch.WatchConfig), ""),
        _Table("[gpu]", "gpu", gpu_check.GpuConfig, _fields(gpu_check.GpuConfig), ""),
        _Table("[check]", "check", gpu_check.CheckConfig, _fields(gpu_check.CheckConfig), ""),
        _Table("[http]", "http", http.HttpConfig, _fields(http.HttpConfig), ""),
    )


def _fields(cls: type) -> tuple[str, ...]:
    """The tables whose parser takes its known keys from the dataclass itself."""
    return tuple(f.name for f in fields(cls))


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the `#:` comment lines just above it in the class body, joined."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        name, colon, _ = text.partition(":")
        if colon and name.isidentifier() and pending:
            out[name] = " ".join(pending)
        pending = []
    return out


def _defaults() -> loading.Config:
    """What the parser makes of the smallest config: every default as it applies it."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model.py").write_text("")
        raw = {"models": [{"name": "m", "entry": "model.py:build", "example": "model.py:ex"}]}
        saved = os.environ.pop(models.DEVICE_ENV, None)
        try:
            config = loading.parse_config(raw, path=root / "hotreload.toml")
        finally:
            if saved is not None:
                os.environ[models.DEVICE_ENV] = saved
        return _relative(config, root)


def _relative(config: loading.Config, root: Path) -> Any:
    """The config with paths shown as the user writes them (relative to the config file)."""
    import dataclasses

    def rel(p: Path) -> str:
        try:
            return p.resolve().relative_to(root.resolve()).as_posix() or "."
        except ValueError:
            return str(p)

    model = config.models[0]
    model = dataclasses.replace(model, watch=tuple(rel(p) for p in model.watch))
    return dataclasses.replace(config, models=(model,), state_dir=rel(config.state_dir))


def _toml(value: Any) -> str:
    """A default as TOML, or a word where TOML has none."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int | float):
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, Mapping):
        return "`{}`" if not value else f"`{dict(value)}`"
    if is_dataclass(value):
        return "table, below"
    return f"`{value}`"


def _default_of(defaults: loading.Config, table: _Table, key: str) -> str:
    if (table.path, key) in _REQUIRED:
        return "required"
    holder: Any = {
        "": defaults,
        "models": defaults.models[0],
        "models.deadlines": defaults.models[0].deadlines,
    }.get(table.path) or getattr(defaults, table.path)
    return _toml(getattr(holder, key))


def render_reference() -> str:
    """The whole page, as Markdown."""
    defaults = _defaults()
    out = [
        "# Configuration reference",
        "",
        "<!-- Written by `python -m hotreload.config.reference docs/configuration.md` from",
        "     hotreload/config/; tests/test_docs.py fails when this page and the code differ. -->",
        "",
        "The config is `hotreload.toml`, or a `[tool.hotreload]` table in `pyproject.toml`",
        "(then every table below is under `tool.hotreload.`). `hotreload init` writes a",
        "commented starter. An unknown key is refused with the closest known one suggested,",
        "and every value is checked before anything starts (exit code 2).",
    ]
    for table in _tables():
        comments = field_comments(table.cls)
        out += ["", f"## {table.header}", ""]
        if table.intro:
            out += [table.intro, ""]
        out += ["| key | default | |", "|---|---|---|"]
        for key in table.keys:
            if key not in comments and key in ELSEWHERE:
                out.append(f"| `{key}` | - | {ELSEWHERE[key]} |")
                continue
            if key not in comments:
                raise ValueError(
                    f"{table.cls.__name__}.{key} has no #: comment: say what the key does "
                    "above its field, for the configuration reference"
                )
            text = comments[key].replace("|", "\\|")
            out.append(f"| `{key}` | {_default_of(defaults, table, key)} | {text} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    """Write the page to the path given (stdout without one)."""
    page = render_reference()
    if not argv:
        sys.stdout.write(page)
    else:
        Path(argv[0]).write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`Checker`: reads typed values out of one TOML table of the config, and the errors it raises.

Every config table is read through one, so every error names the file, the full key path and
what was expected, and an unknown key gets the closest known one suggested.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from hotreload.errors import ConfigError, did_you_mean


class Checker:
    """Reads typed values out of one TOML table, reporting errors with the full key path."""

    def __init__(self, table: Any, *, path: Path, key: str, known: tuple[str, ...]) -> None:
        self.path = path
        self.key = key
        if not isinstance(table, dict):
            self.fail(key or "(top level)", f"expected a table, got {kind_of(table)}")
        self.table: dict[str, Any] = table
        for name in table:
            if name not in known:
                suggestion = did_you_mean(name, list(known))
                allowed = ", ".join(known)
                self.fail(self.sub(name), f"unknown key{suggestion} (known keys here: {allowed})")

    def subtable(self, name: str, known: tuple[str, ...]) -> Checker:
        """A checker for the sub-table `name` of this one (absent: read as empty), whose keys
        must be among `known`."""
        return Checker(
            self.get(name, dict, {}, "a table"), path=self.path, key=self.sub(name), known=known
        )

    def sub(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def fail(self, key: str, message: str) -> None:
        raise ConfigError(message, path=str(self.path), key=key)

    def get(self, name: str, kind: type | tuple[type, ...], default: Any, what: str) -> Any:
        if name not in self.table:
            return default
        value = self.table[name]
        # bool is an int in Python; `warmup_iters = true` must not pass as 1.
        if isinstance(value, bool) and bool not in as_tuple(kind):
            self.fail(self.sub(name), f"expected {what}, got a boolean")
        if not isinstance(value, kind):
            self.fail(self.sub(name), f"expected {what}, got {kind_of(value)} {value!r}")
        return value

    def number(
        self, name: str, default: float | None, *, minimum: float, what: str = "a number"
    ) -> float | None:
        value = self.get(name, (int, float), default, what)
        if value is not None and not math.isfinite(value):
            # nan compares false with everything (it disabled timeouts), inf never fires.
            self.fail(self.sub(name), f"expected {what} (a finite number), got {value}")
        if value is not None and value < minimum:
            self.fail(self.sub(name), f"expected {what} >= {minimum}, got {value}")
        return None if value is None else float(value)

    def integer(self, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        value = self.get(name, int, default, "an integer")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            self.fail(self.sub(name), f"expected an integer {bound}, got {value}")
        return int(value)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(name, str, default, "a string")
        if value not in choices:
            hint = difflib.get_close_matches(value, choices, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.fail(
                self.sub(name), f"expected one of {', '.join(choices)}; got {value!r}{suggestion}"
            )
        return value

    def str_list(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, (list, str), list(default), "a string or a list of strings")
        items = [value] if isinstance(value, str) else value
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                self.fail(f"{self.sub(name)}[{i}]", f"expected a non-empty string, got {item!r}")
        return tuple(items)


def as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def kind_of(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)

"""The dashboard's golden panel: how the selected model's serving version answers the
golden inputs next to the version it replaced (engine/golden.py `compare`, carried in the
model's status as `golden`). Hidden until a reload compared something."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hotreload.engine.golden_text import headline
from hotreload.tui.widgets import Panel

#: Output and prompt lines shown at most (the status JSON and `hotreload diff` have all).
MAX_LINES = 4


def golden_text(diff: dict[str, Any]) -> Text:
    """The comparison's headline (identical, changed, within tolerance), then a line per
    output that changed: largest absolute and relative difference, top-1 flips; per prompt
    that changed, the first differing token and both texts."""
    same = bool(diff.get("identical"))
    t = Text(f"v{diff.get('from')} -> v{diff.get('to')}: ", "bold")
    t.append(headline(diff), "green" if same else "yellow")
    outputs = [e for e in diff.get("outputs", []) if not e.get("bit_equal", not e.get("changed"))]
    texts = [p for p in diff.get("texts", []) if p.get("changed")]
    lines = 0
    for e in outputs:
        if lines >= MAX_LINES:
            break
        lines += 1
        if e.get("note"):
            t.append(f"\n  {e['output']}: {e['note']}")
            continue
        flips = f"  top-1 flips {e['flips']}/{e['positions']}" if e.get("flips") is not None else ""
        rel = f"  max rel {e['max_rel']:.3g}" if e.get("max_rel") is not None else ""
        t.append(f"\n  {e['output']}: max abs {e['max_abs']:.3g}{rel}{flips}")
    for p in texts:
        if lines >= MAX_LINES:
            break
        lines += 1
        t.append(f"\n  prompt {p['index']} differs at token {p['first_token']}: ")
        t.append(repr(p["old"]), "red")
        t.append(" -> ")
        t.append(repr(p["new"]), "green")
    if len(outputs) + len(texts) > lines:
        more = len(outputs) + len(texts) - lines
        t.append(f"\n  {more} more (hotreload diff shows all)", "dim")
    return t


class GoldenPanel(Panel):
    """Shown while the selected model has a golden comparison."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Golden outputs", id=id)
        self.display = False

    def show(self, model: dict[str, Any] | None) -> None:
        diff = (model or {}).get("golden")
        self.display = bool(diff)
        if diff:
            self.view = golden_text(diff)

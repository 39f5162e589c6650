"""Fit the reloads table to the terminal's width, so no row is cut at the border.

A DataTable sizes each column to its widest cell and lets the last ones run off the right
edge; with one reload's phases ("lock 2031 load 10 warm 21 smoke 12 gate 0 drain 14 ...")
the row never fits 80 or 120 columns and a newcomer reads half a word. Here the phases cell
keeps the phases that fit and ends in "…" (the detail line under the table lists them all);
where even its heading does not fit, the column goes. Then the trigger, then the policy, are
shortened with "…" until the row fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text

#: DataTable's default cell padding: one column each side of a cell.
PAD = 2
#: The reload columns, in the order render.reload_rows fills them.
RELOAD_COLUMNS = ("Time", "Model", "Outcome", "Total", "Trigger", "Policy", "Phases ms")
PHASES, TRIGGER, POLICY = 6, 4, 5
#: Under this much room the phases column goes (its heading alone is 9).
MIN_PHASES = 12
#: A shortened trigger or policy keeps at least this much.
MIN_CELL = 8


def _width(cell: Any) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))


def _cut(cell: Any, room: int) -> Any:
    """`cell` in at most `room` cells, ending in "…" when shortened; a Text keeps its style."""
    if _width(cell) <= room:
        return cell
    if isinstance(cell, Text):
        short = cell.copy()
        short.truncate(room, overflow="ellipsis")
        return short
    return str(cell)[: max(room - 1, 0)] + "…"


def fit_phases(text: str, room: int) -> str:
    """The leading "name ms" pairs of `text` that fit in `room`, then "…" if any are left."""
    words = text.split()
    pairs = [" ".join(words[i : i + 2]) for i in range(0, len(words), 2)]
    shown: list[str] = []
    for i, pair in enumerate(pairs):
        rest = i < len(pairs) - 1
        candidate = " ".join([*shown, pair]) + (" …" if rest else "")
        if cell_len(candidate) > room:
            break
        shown.append(pair)
    if len(shown) == len(pairs):
        return text
    return " ".join([*shown, "…"]) if shown else "…"


def fit_reload_rows(
    rows: Sequence[tuple[Any, ...]], width: int, columns: tuple[str, ...] = RELOAD_COLUMNS
) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """The columns to show and the rows cut to `width` cells (the table's inner width)."""
    if width <= 0:
        return columns, tuple(rows)

    def widths(cols: tuple[str, ...], cells: list[list[Any]]) -> list[int]:
        return [max([cell_len(h)] + [_width(r[i]) for r in cells]) for i, h in enumerate(cols)]

    table = [list(r) for r in rows]
    fixed = widths(columns[:PHASES], [r[:PHASES] for r in table])
    room = width - sum(w + PAD for w in fixed) - PAD
    if room >= MIN_PHASES:
        for r in table:
            r[PHASES] = fit_phases(str(r[PHASES]), room)
        return columns, tuple(tuple(r) for r in table)
    columns = columns[:PHASES]
    table = [r[:PHASES] for r in table]
    for index in (TRIGGER, POLICY):
        over = sum(w + PAD for w in widths(columns, table)) - width
        if over <= 0:
            break
        current = widths(columns, table)[index]
        keep = max(current - over, MIN_CELL, cell_len(columns[index]))
        for r in table:
            r[index] = _cut(r[index], keep)
    return columns, tuple(tuple(r) for r in table)

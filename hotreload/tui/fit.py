"""Fit the reloads table to the terminal's width, so no row is cut at the border.

A DataTable sizes each column to its widest cell and lets the last ones run off the right
edge; with one reload's phases ("lock 2031 load 10 warm 21 smoke 12 gate 0 drain 14 ...")
the row never fits 80 or 120 columns and a newcomer reads half a word. Here the phases cell
keeps the phases that fit and ends in "…" (the detail line under the table lists them all);
where even its heading does not fit, the column goes. Then the trigger, then the policy, are
shortened with "…" until the row fits (the policy loses its strategy first). A long trigger
gives way before the phases do.

The models table fits the same way: the weights' digest goes first, then the time of the
last reload (the Reloads table has it), so "FAILED in load" is never cut at the border.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
#: A trigger shortened to keep the phases column keeps at least this much, and leaves the
#: phases up to this much room (three or four phases).
MIN_TRIGGER, PHASES_ROOM = 16, 28
#: The models columns, in the order render.model_rows fills them.
MODEL_COLUMNS = ("Model", "Ver", "State", "Policy", "Device", "Last reload")
MODEL_STATE, MODEL_POLICY = 2, 3


def cell_width(cell: Any) -> int:
    """The cells `cell` takes on one line (a Text's style takes none)."""
    return cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))


def column_widths(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[int]:
    """Each column's width: its widest cell, or its heading."""
    return [max([cell_len(h)] + [cell_width(r[i]) for r in rows]) for i, h in enumerate(columns)]


def row_width(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> int:
    """The cells a table of `rows` under `columns` takes, padding included."""
    return sum(w + PAD for w in column_widths(columns, rows))


def first_fitting(forms: Sequence[Sequence[Text]], width: int) -> list[Text]:
    """The first of `forms` (each some lines) whose every line fits `width`, else the last."""
    for lines in forms:
        if all(line.cell_len <= width for line in lines):
            return list(lines)
    return list(forms[-1])


def _cut(cell: Any, room: int) -> Any:
    """`cell` in at most `room` cells, ending in "…" when shortened; a Text keeps its style."""
    if cell_width(cell) <= room:
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

    table = [list(r) for r in rows]
    fixed = column_widths(columns[:PHASES], [r[:PHASES] for r in table])
    room = width - sum(w + PAD for w in fixed) - PAD
    short = max(MIN_TRIGGER, cell_len(columns[TRIGGER]))
    if room < MIN_PHASES <= room + fixed[TRIGGER] - short:
        # A long trigger (several files) gives way before the whole phases column does.
        keep = max(short, fixed[TRIGGER] - (PHASES_ROOM - room))
        for r in table:
            r[TRIGGER] = _cut(r[TRIGGER], keep)
        room += fixed[TRIGGER] - keep
    if room >= MIN_PHASES:
        for r in table:
            r[PHASES] = fit_phases(str(r[PHASES]), room)
        return columns, tuple(tuple(r) for r in table)
    columns = columns[:PHASES]
    table = [r[:PHASES] for r in table]
    if row_width(columns, table) > width:
        # The strategy goes first: the Models panel shows it ("auto/inplace"), and the
        # policy a reload ran with ("auto→availability") is what this column adds.
        for r in table:
            r[POLICY] = str(r[POLICY]).split("/")[0]
    return columns, _shorten(columns, table, width, (TRIGGER, POLICY))


def _shorten(
    columns: Sequence[str], table: list[list[Any]], width: int, order: Sequence[int]
) -> tuple[tuple[Any, ...], ...]:
    """The cells of the columns in `order` shortened with "…", one column after the other,
    until the rows fit `width`."""
    for index in order:
        over = row_width(columns, table) - width
        if over <= 0:
            break
        current = column_widths(columns, table)[index]
        keep = max(current - over, MIN_CELL, cell_len(columns[index]))
        for r in table:
            r[index] = _cut(r[index], keep)
    return tuple(tuple(r) for r in table)


def fit_model_rows(
    build: Callable[..., tuple[tuple[Any, ...], ...]], width: int
) -> tuple[tuple[Any, ...], ...]:
    """The models rows that fit `width`: `build(digests=, times=)` (render.model_rows) in
    its widest form that fits, else its narrowest with the policy, then the state, cut."""
    rows: tuple[tuple[Any, ...], ...] = ()
    for digests, times in ((True, True), (False, True), (False, False)):
        rows = build(digests=digests, times=times)
        if width <= 0 or row_width(MODEL_COLUMNS, rows) <= width:
            return rows
    return _shorten(MODEL_COLUMNS, [list(r) for r in rows], width, (MODEL_POLICY, MODEL_STATE))

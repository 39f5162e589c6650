"""The dashboard's reload rows fit the terminal, it says how to reach the model, and it
leaves a blank screen behind after `q` (issue 31's smaller trips)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rich.text import Text
from textual.app import App

from hotreload.tui.app import build_app
from hotreload.tui.fit import RELOAD_COLUMNS, fit_phases, fit_reload_rows
from hotreload.tui.render import reach_text
from hotreload.tui.source import Sample
from hotreload.tui.terminal import CLEAR_BEFORE_LEAVING, clean_exit_driver
from hotreload.tui.widgets import RowsTable
from tests.scripted_source import ScriptedSource, cpu_scenario

PHASES = "lock 2031 load 10 warm 21 smoke 12 gate 0 drain 14 sync 0 swap 0 release 4"
FIRST_ROW = (
    "23:13:41", "mlp", Text("v2 ok", "green"), "2.12 s", "file model.py",
    "availability/inplace", PHASES,
)  # fmt: skip


def _row_width(columns: tuple[str, ...], rows: tuple[tuple[Any, ...], ...]) -> int:
    def width(cell: Any) -> int:
        return cell.cell_len if isinstance(cell, Text) else len(str(cell))

    return sum(max([len(h)] + [width(r[i]) for r in rows]) + 2 for i, h in enumerate(columns))


@pytest.mark.parametrize("inner", [74, 114, 200])
def test_the_first_reload_row_fits_80_and_120_columns(inner: int) -> None:
    columns, rows = fit_reload_rows([FIRST_ROW], inner)
    assert _row_width(columns, rows) <= inner
    if inner == 74:  # 80 columns: no room for the phases, the detail line lists them
        assert columns == RELOAD_COLUMNS[:6]
        assert rows[0][4] == "file model.py" and rows[0][5] == "availability/inplace"
    elif inner == 114:  # 120 columns: the phases that fit, then "…"
        assert columns == RELOAD_COLUMNS and rows[0][6].startswith("lock 2031 load 10")
        assert rows[0][6].endswith(" …")
    else:
        assert rows[0][6] == PHASES  # room for all: nothing cut


def test_a_long_trigger_is_shortened_rather_than_cut_at_the_border() -> None:
    row = (*FIRST_ROW[:4], "file layers/attention_heads.py", *FIRST_ROW[5:])
    columns, rows = fit_reload_rows([row], 74)
    assert _row_width(columns, rows) <= 74 and rows[0][4].endswith("…")


def test_phases_are_cut_between_pairs() -> None:
    assert fit_phases("load 10 warm 21 smoke 12", 16) == "load 10 …"
    assert fit_phases("load 10 warm 21", 15) == "load 10 warm 21"
    assert fit_phases("load 10 warm 21", 3) == "…"


def _sample(**fields: Any) -> Sample:
    return Sample(taken_at=0.0, models=(), reloads=(), gpu=None, xids=(), **fields)


def test_reach_text_names_the_http_routes_or_the_socket() -> None:
    http = _sample(http_url="http://127.0.0.1:8000", generators=("gen",), socket="s.sock")
    assert reach_text(http, "mlp", 74) == "KServe v2 POST http://127.0.0.1:8000/v2/models/mlp/infer"
    assert reach_text(http, "gen", 200).endswith("completions base URL http://127.0.0.1:8000/v1")
    assert reach_text(http, "gen", 74) == (
        "HTTP http://127.0.0.1:8000/v2/models/gen/infer · http://127.0.0.1:8000/v1"
    )
    plain = _sample(socket=".hotreload/hotreload.sock")
    assert "--http 127.0.0.1:8000 adds KServe v2" in reach_text(plain, "mlp", 110)
    assert reach_text(None, "mlp", 80) == ""


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_no_reload_row_runs_past_the_table_in_the_app(size: tuple[int, int]) -> None:
    samples, state = cpu_scenario()
    app = build_app(ScriptedSource(samples), state=state)

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await app.wait_for_first_sample(10)
            await pilot.pause()
            table = app.query_one("#reloads", RowsTable)
            widths = [c.get_render_width(table) for c in table.columns.values()]
            assert sum(widths) <= table.scrollable_content_region.width
            subtitle = str(app.query_one("#models", RowsTable).border_subtitle)
            assert subtitle.startswith("socket .hotreload/hotreload.sock")

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_driver_clears_the_screen_before_leaving_the_alternate_screen() -> None:
    from textual.drivers.linux_driver import LinuxDriver

    written: list[str] = []

    class Writer:
        def write(self, data: str) -> None:
            written.append(data)

        def flush(self) -> None:
            pass

    async def stop() -> None:  # a driver is made inside the app's event loop
        driver = clean_exit_driver(LinuxDriver)(App(), mouse=False)
        driver._writer_thread = Writer()  # type: ignore[assignment]
        driver.attrs_before = None
        driver.stop_application_mode()

    asyncio.run(stop())
    out = "".join(written)
    assert CLEAR_BEFORE_LEAVING in out
    assert out.index(CLEAR_BEFORE_LEAVING) < out.index("\x1b[?1049l")

"""The dashboard at the sizes people use, 80x24 and 120x36, read as text the way a person
reads the screen (issue 43, item 2): rows line up with their headings, no figure or word is
cut or wrapped in two, and the panels use the same words for the same reload."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest
from rich.console import Console
from rich.text import Text
from textual.pilot import Pilot

from hotreload.engine.model import ReloadOutcome
from hotreload.engine.model.unchanged import UNCHANGED
from hotreload.tui import render
from hotreload.tui.app import DETACHED, DashboardApp, build_app
from hotreload.tui.fit import RELOAD_COLUMNS, fit_reload_rows
from hotreload.tui.source import Sample
from hotreload.tui.state import DashboardState
from hotreload.tui.widgets import RowsTable
from tests.scripted_source import T0, ScriptedSource, cpu_scenario

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
#: The Xid sources as a machine without a driver reports them (the nvml reason is long).
SOURCES = (
    {"name": "nvml", "active": False,
     "reason": "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed"},
    {"name": "kmsg", "active": True, "reason": None},
)  # fmt: skip


def _failed() -> ReloadOutcome:
    return ReloadOutcome(
        "mlp", False, 5, "file", "availability", "inplace", phase="load",
        error="SyntaxError: invalid syntax (model.py, line 44)", phases={"load": 0.017},
        total_s=0.04, detail=["model.py"], started_at=T0 - 20,
    )  # fmt: skip


def _unchanged() -> ReloadOutcome:
    """A save without a change, as the engine reports it (engine/model/unchanged.py)."""
    return ReloadOutcome(
        "mlp", True, 5, "file", "", "inplace", phases={"snapshot": 0.004}, total_s=0.004,
        detail=["model.py", f"{UNCHANGED}: code and weights are those v5 serves "
                "(hotreload reload --force builds it again)"],
        started_at=T0 - 10, unchanged=True,
    )  # fmt: skip


def scenario(last: ReloadOutcome | None = None) -> tuple[list[Sample], DashboardState]:
    """The example on a CPU: v5 with its weights' digest and one push over them, slow
    requests (p50 227 ms) of a text generator, and `last` as the newest reload."""
    samples, state = cpu_scenario()
    sample = samples[-1]
    (m,) = sample.models
    m = {
        **m, "version": 5, "digest": "sha256:1ddfcdc2a0b1c2d3e4f5", "pushes": 1,
        "latency": {**m["latency"], "p50_ms": 226.70, "p95_ms": 381.62, "p99_ms": 412.05},
        "text": {"completions": 40, "tokens_per_s": 1234.5, "ttft_p50_ms": 48.2},
        "cpus": {"serving": [1], "rest": [0]},
    }  # fmt: skip
    reloads = sample.reloads + ((last,) if last else ())
    return [replace(sample, models=(m,), reloads=reloads, xid_sources=SOURCES)], state


def screen(app: DashboardApp) -> list[str]:
    """The screen as text, one string per terminal line."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


def panel(lines: list[str], title: str, column: int = 0) -> list[str]:
    """The inside of the bordered panel whose top border holds `title`, its `column`th one
    of those side by side (Queue, Latency, Memory share their lines)."""
    top = next(i for i, line in enumerate(lines) if f"─ {title}" in line)
    start = [m.start() for m in re.finditer("╭", lines[top])][column]
    end = lines[top].index("╮", start)
    inside = []
    for line in lines[top + 1 :]:
        if line[start] == "╰":
            break
        inside.append(line[start + 1 : end].strip(" ▁▂▃▄▅▆▇█"))
    return inside


def run(
    samples_state: tuple[list[Sample], DashboardState],
    size: tuple[int, int],
    body: Callable[[DashboardApp, Pilot], Awaitable[None]],
    *,
    owner: bool = True,
) -> DashboardApp:
    samples, state = samples_state
    app = build_app(ScriptedSource(samples), state=state, owner=owner)
    app.animation_level = "none"

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await app.wait_for_first_sample(10)
            await pilot.pause()
            await body(app, pilot)

    asyncio.run(asyncio.wait_for(main(), 60))
    return app


def models_row(lines: list[str]) -> tuple[str, str]:
    header = next(line for line in lines if "│  Model" in line)
    return header, lines[lines.index(header) + 1]


def assert_lined_up(header: str, row: str, cells: dict[str, str]) -> None:
    for heading, cell in cells.items():
        at = header.index(heading)
        assert row[at:].startswith(cell), f"{heading!r} over {row[at:]!r}:\n{header}\n{row}"


# ---------------------------------------------------------------------- models


@SIZES
def test_the_models_row_lines_up_with_its_header_and_says_what_plus_one_is(
    size: tuple[int, int],
) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        header, row = models_row(screen(app))
        assert_lined_up(header, row, {"Ver": "v5 ", "State": "serving", "Device": "cpu"})
        assert "+1 push " in row  # not a bare "+1"
        if size[0] >= 120:
            assert "v5 1ddfcdc2 +1 push" in row  # room for the digest too

    run(scenario(), size, body)


@SIZES
def test_rows_drawn_before_the_table_measures_them_still_line_up(size: tuple[int, int]) -> None:
    """A frame drawn between new rows and the table's own measuring stayed on screen with
    each cell cut to its heading's width ("v3", "servi") in a real `hotreload dashboard`."""

    async def body(app: DashboardApp, pilot: Pilot) -> None:
        table = app.query_one("#models", RowsTable)
        (m,) = app.state.sample.models
        pushed = {**m, "version": 6, "pushes": 2}
        app.state.sample = replace(app.state.sample, models=(pushed,))
        table.view = render.model_rows(app.state, app.source.clock.hms, digests=False)
        table.render_line(1)  # what the compositor may do before the table's queue is idle
        await pilot.pause()  # the table measures its rows now: too late for that frame
        header, row = models_row(screen(app))
        assert_lined_up(header, row, {"Ver": "v6 +2 pushes", "State": "serving"})

    run(scenario(), size, body)


@SIZES
def test_a_failed_reload_reads_whole_in_the_models_row(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        header, row = models_row(screen(app))
        cell = row[header.index("Last reload") :]
        assert re.match(r"(09:29:40 )?FAILED in load ", cell), f"\n{header}\n{row}"

    run(scenario(_failed()), size, body)


# ---------------------------------------------------------------------- latency, xids


@SIZES
def test_latency_shows_tokens_and_never_wraps_a_figure(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        latency = panel(screen(app), "Latency mlp", column=1)
        text = "\n".join(latency)
        for figure in ("p50 227", "p95 382", "p99 412", "1,234 tok/s"):
            assert figure in text, f"{figure!r} not whole in:\n{text}"
        assert re.search(r"(first|1st) token 48\.2 ms", text), text
        assert not any(re.search(r"p\d\d$", line) for line in latency), text

    run(scenario(), size, body)


@SIZES
def test_the_xid_sources_line_names_every_source_whole(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        lines = screen(app)
        border = next(line for line in lines if "sources:" in line)
        assert "nvml off" in border and "kmsg on" in border and "…" not in border, border

    run(scenario(), size, body)


@SIZES
def test_the_memory_panel_keeps_the_serving_cpu_on_its_models_line(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        memory = panel(screen(app), "Memory", column=2)
        line = next(line for line in memory if line.startswith("mlp pid"))
        assert line.endswith("CPU 1"), memory  # not "... on CPU" over a lone "1"

    run(scenario(), size, body)


# ---------------------------------------------------------------------- reloads


@SIZES
def test_an_unchanged_save_reads_unchanged_in_both_panels(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        lines = screen(app)
        _, row = models_row(lines)
        assert "unchanged" in row and "ok 0.00 s" not in row, row
        reloads = panel(lines, "Reloads")
        assert "v5 unchanged" in reloads[1], reloads[1]
        # The sentence is the line under the table, not a trigger that crowds out the rest.
        assert "nothing to reload" not in reloads[1]
        assert any("unchanged: nothing to reload" in line for line in lines)
        if size[0] >= 120:
            assert "Phases ms" in reloads[0], reloads[0]

    run(scenario(_unchanged()), size, body)


@SIZES
def test_both_panels_name_the_policy_auto(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        lines = screen(app)
        _, row = models_row(lines)
        assert "auto/inplace" in row
        reloads = panel(lines, "Reloads")
        newest = reloads[1]
        assert "auto→availability" in newest, newest
        if size[0] >= 120:
            assert "auto→availability/inplace" in newest

    run(scenario(), size, body)


@SIZES
def test_the_phases_under_the_reloads_wrap_between_phases_never_inside_one(
    size: tuple[int, int],
) -> None:
    phases = {"load": 0.0122, "warm": 0.0063, "smoke": 0.0042, "gate": 0.0, "drain": 0.0061,
              "sync": 0.0, "swap": 0.0001, "release": 0.0024, "evict": 0.0113,
              "compile": 0.0107}  # fmt: skip
    ok = ReloadOutcome("mlp", True, 6, "file", "availability", "inplace", phases=phases,
                       total_s=0.04, detail=["model.py"], started_at=T0 - 5)  # fmt: skip

    async def body(app: DashboardApp, pilot: Pilot) -> None:
        lines = screen(app)
        first = next(i for i, line in enumerate(lines) if "v6 phases (ms):" in line)
        text = "\n".join(lines[first : first + 3])
        for name, s in phases.items():
            assert f"{name} {s * 1000:.1f}" in text, f"{name} parted from its figure:\n{text}"
        assert all(len(line.rstrip()) <= size[0] for line in lines)

    run(scenario(ok), size, body)


@SIZES
def test_the_footer_names_every_key_whole_rollback_included(size: tuple[int, int]) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        footer = screen(app)[-1]
        for key, label in [("r", "Reload"), ("R", "All"), ("w", "Warm"), ("b", "Back"),
                           ("p", "Pause"), ("x", "Reset GPU"), ("l", "Load"), ("?", "Help"),
                           ("q", "Quit")]:  # fmt: skip
            assert f" {key} {label} " in footer, f"{key} {label} not whole in {footer!r}"

    run(scenario(), size, body)


def test_a_long_trigger_gives_way_before_the_phases_column_goes() -> None:
    phases = "lock 1 load 10 warm 21 smoke 12 gate 0 drain 14 sync 0 swap 0 release 4"
    trigger = "file layers/attention.py, layers/mlp.py, layers/norm.py, tokenizer.py"
    row = ("23:13:41", "mlp", Text("v2 ok"), "2.12 s", trigger, "auto→availability/inplace")
    columns, rows = fit_reload_rows([(*row, phases)], 114)  # a 120-column terminal
    assert columns == RELOAD_COLUMNS and rows[0][6].startswith("lock 1 load 10 warm 21")
    assert str(rows[0][4]).startswith("file layers/") and str(rows[0][4]).endswith("…")


# ---------------------------------------------------------------------- quit


@pytest.mark.parametrize("owner", [False, True], ids=["attached", "owner"])
def test_q_in_an_attached_dashboard_says_the_session_keeps_serving(owner: bool) -> None:
    async def body(app: DashboardApp, pilot: Pilot) -> None:
        await pilot.press("q")
        while app.return_code is None:  # bounded by run()'s wait_for
            await pilot.pause(0.05)

    app = run(scenario(), (80, 24), body, owner=owner)
    if owner:  # `hotreload watch` itself prints that it stops
        assert app.exit_message is None
    else:
        assert app.exit_message == DETACHED and "keeps serving" in DETACHED

"""The dashboard's rollback key: `b` asks the session to serve the selected model's version
before the serving one again (the op `hotreload rollback` uses); the help page lists it."""

from __future__ import annotations

import asyncio


def test_b_rolls_the_selected_model_back_and_the_help_lists_it() -> None:
    async def main() -> None:
        from hotreload.tui.app import build_app
        from tests.scripted_source import ScriptedSource, cpu_scenario

        samples, state = cpu_scenario()
        source = ScriptedSource(samples)
        app = build_app(source, state=state)
        app.animation_level = "none"
        async with app.run_test(size=(120, 40)) as pilot:
            await app.wait_for_first_sample(10)  # type: ignore[attr-defined]
            await pilot.press("b")
            await pilot.pause()
            for _ in range(100):  # the key's worker runs beside the app
                if ("rollback", "mlp") in source.calls:
                    break
                await asyncio.sleep(0.02)
            assert ("rollback", "mlp") in source.calls, source.calls
            await pilot.press("question_mark")
            await pilot.pause()
            shown = app.export_screenshot()
            line = "b        roll the selected model back"
            assert line in shown or line.replace(" ", "&#160;") in shown

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_rollback_row_says_where_to_and_its_detail_shows_the_versions_eval() -> None:
    from hotreload.engine.model import ReloadOutcome
    from hotreload.tui.render import reload_detail, trigger_text

    row = ReloadOutcome("mlp", True, 4, "rollback", phases={"load": 0.01}, detail=["to v1"])
    assert trigger_text(row) == "rollback to v1"
    assert "eval" not in reload_detail(row, None).plain  # not run yet
    row.eval = {"version": 4, "figures": {"loss": 0.41237, "accuracy": 0.875}, "eval_s": 0.25}
    assert "eval: loss 0.4124, accuracy 0.875 (0.25 s)" in reload_detail(row, None).plain
    row.eval = {"version": 4, "error": "eval: evals.py:score raised ValueError: boom"}
    assert "eval: FAILED: eval: evals.py:score raised" in reload_detail(row, None).plain

"""The dashboard's golden panel (tui/golden_panel.py) as text: each figure said once, and
what does not fit said to be left out, with where to read it."""

from __future__ import annotations

import numpy as np

from hotreload.engine import golden
from hotreload.engine.golden import GoldenSet
from hotreload.tui.golden_panel import MAX_LINES, golden_text


def outputs(names: list[str], scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: (rng.standard_normal((2, 10)) * scale).astype(np.float32) for n in names}


def test_one_changed_output_says_its_figures_once_under_the_headline() -> None:
    diff = golden.compare(
        GoldenSet((outputs(["output"], 1.0),)), GoldenSet((outputs(["output"], 2.0),)),
        old_version=1, new_version=2,
    )  # fmt: skip
    lines = golden_text(diff).plain.splitlines()
    assert lines[0] == "v1 -> v2: outputs changed on 1 golden input", lines
    assert lines[1].startswith("  output: max abs "), lines
    assert "max rel 1  top-1 flips 0/2" in lines[1], lines
    assert golden_text(diff).plain.count("max abs") == 1


def test_outputs_past_the_panels_lines_are_counted_and_left_to_hotreload_diff() -> None:
    names = [f"head{i}" for i in range(MAX_LINES + 2)]
    diff = golden.compare(GoldenSet((outputs(names, 1.0),)), GoldenSet((outputs(names, 3.0),)))
    lines = golden_text(diff).plain.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1 : 1 + MAX_LINES]] == names[:MAX_LINES]
    assert lines[-1] == "  2 more (hotreload diff shows all)", lines


def test_identical_and_within_tolerance_headlines() -> None:
    same = outputs(["output"], 1.0)
    diff = golden.compare(GoldenSet((same,)), GoldenSet((same,)), old_version=3, new_version=4)
    assert golden_text(diff).plain == "v3 -> v4: outputs identical on 1 golden input"
    moved = {"output": same["output"] + np.float32(1e-4)}
    diff = golden.compare(GoldenSet((same,)), GoldenSet((moved,)), tolerance=1e-3)
    head, *rest = golden_text(diff).plain.splitlines()
    assert head.endswith(": outputs within tolerance 0.001 on 1 golden input"), head
    assert len(rest) == 1 and rest[0].startswith("  output: max abs"), rest

"""`golden`, `expect` and `tolerance` of a model: the inputs every new version runs before
it serves, compared with the version it replaces (engine/golden.py), and whether a change
refuses the version.

    golden = "model.py:golden"  # a callable returning a list of inputs (prompts, for a generator)
    expect = "same"             # refuse a version whose golden outputs change (a refactor)
    tolerance = 1e-6            # how far an output may move and still be "the same"
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotreload.config.checker import Checker

#: `expect`: "any" shows what changed; "same" refuses a version whose golden outputs change.
EXPECTS = ("any", "same")


def parse_golden(
    m: Checker, root: Path, parse_entry: Callable[..., Any]
) -> tuple[Any | None, str, float]:
    """(`golden` as an EntryPoint or None, `expect`, `tolerance`), checked. `parse_entry` is
    models.parse_entry (models imports this module)."""
    raw = m.get("golden", str, None, 'a string such as "model.py:golden"')
    entry = parse_entry(raw, checker=m, key="golden", root=root) if raw is not None else None
    expect = m.choice("expect", "any", EXPECTS)
    tolerance = m.number(
        "tolerance", 0.0, minimum=0.0, what="the largest absolute difference allowed (0: bit-equal)"
    )
    if "tolerance" in m.table and expect != "same":
        m.fail(
            m.sub("tolerance"),
            'tolerance bounds the changes expect = "same" allows: set expect = "same" as '
            "well (or remove tolerance)",
        )
    return entry, expect, tolerance or 0.0

"""No module in hotreload/ over MAX_LINES: a module that long no longer reads top to bottom.

Today's offenders are listed with the length they have now and why they are still long.
The list may only shrink: an offender may not grow, and one that got under the limit must
leave the list (the test says so), so the limit holds for it from then on.
"""

from __future__ import annotations

from pathlib import Path

MAX_LINES = 500
PACKAGE = Path(__file__).resolve().parent.parent / "hotreload"

#: Path under hotreload/ -> (its length today, at most; why it is still over the limit).
ALLOWED_OVER: dict[str, tuple[int, str]] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit() -> None:
    too_long = {
        rel: n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := _lines(path)) > MAX_LINES
        and (rel := path.relative_to(PACKAGE).as_posix()) not in ALLOWED_OVER
    }
    assert too_long == {}, f"split these modules (at most {MAX_LINES} lines): {too_long}"


def test_the_allowed_offenders_only_shrink() -> None:
    for rel, (allowed, why) in ALLOWED_OVER.items():
        path = PACKAGE / rel
        assert why, rel
        assert path.is_file(), f"{rel} is gone: take it off ALLOWED_OVER"
        n = _lines(path)
        assert n <= allowed, f"{rel} grew to {n} lines (allowed {allowed}): split it instead"
        assert n > MAX_LINES, f"{rel} is {n} lines now: take it off ALLOWED_OVER"

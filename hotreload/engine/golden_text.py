"""A golden comparison (engine/golden.py `compare`) in words: the reload row, the
dashboard, `hotreload status`, `hotreload diff`. No numpy: the printer and the CLI read it.
"""

from __future__ import annotations

from typing import Any

#: Outputs listed by name in a one-line summary, at most.
SUMMARY_OUTPUTS = 3


def headline(diff: dict[str, Any]) -> str:
    """The summary's lead without the outputs' figures: where the figures follow on lines of
    their own (the dashboard's golden panel), the summary would say them twice."""
    return _lead(diff)[0]


def summary(diff: dict[str, Any]) -> str:
    """One line: "outputs identical", or what changed the most."""
    lead, changed_from = _lead(diff)
    if not changed_from:
        return lead
    parts: list[str] = []
    if diff.get("inputs_changed") and "input_notes" not in diff:  # an older event's form
        parts.append("the golden inputs changed")
    changed = [
        e for e in diff.get("outputs", []) if e.get("changed") or not e.get("bit_equal", True)
    ]
    for e in changed[:SUMMARY_OUTPUTS]:
        if e.get("note"):
            parts.append(f"{e['output']}: {e['note']}")
            continue
        text = f"{e['output']} max abs {_num(e.get('max_abs'))}"
        if e.get("max_rel") is not None:
            text += f" rel {_num(e['max_rel'])}"
        if e.get("flips") is not None:
            text += f", {e['flips']}/{e['positions']} top-1 flip(s)"
        parts.append(text)
    if len(changed) > SUMMARY_OUTPUTS:
        parts.append(f"{len(changed) - SUMMARY_OUTPUTS} more output(s)")
    for t in diff.get("texts", []):
        if t["changed"]:
            parts.append(
                f"prompt {t['index']}: token {t['first_token']} differs: "
                f"{_clip(t['old'])!r} -> {_clip(t['new'])!r}"
            )
    return f"{changed_from}: " + "; ".join(parts) + _left(diff)


def _lead(diff: dict[str, Any]) -> tuple[str, str]:
    """(the headline, and where outputs differ the words the summary's figures follow)."""
    n = diff.get("inputs", 0)
    k = diff.get("compared", n)  # what only some inputs compared says how many
    on = f"on {n} golden input{'s' if n != 1 else ''}" if k == n else f"on {k} of {n} golden inputs"
    left = _left(diff)
    if diff.get("identical"):
        return f"outputs identical {on}{left}", ""
    if not k:
        return f"no golden input compared{left}", ""
    if diff.get("same"):  # every difference within tolerance
        changed_from = f"outputs within tolerance {diff.get('tolerance', 0):g} {on}"
    else:
        changed_from = f"outputs changed {on}"
    return changed_from + left, changed_from


def _left(diff: dict[str, Any]) -> str:
    # The inputs left out (fed other values, new, over the size bound): said, never a change.
    return "".join(f"; {x}" for x in diff.get("input_notes") or [])


def refusal(diff: dict[str, Any]) -> str:
    """Why `expect = "same"` refused the version, and what to change."""
    tol = diff.get("tolerance", 0.0)
    bound = "bit-equal" if not tol else f"within tolerance {tol:g}"
    return (
        f'expect = "same": golden outputs not {bound}: {summary(diff)}; the serving version '
        'keeps serving. If the change is intended, set expect = "any" (or raise tolerance)'
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"

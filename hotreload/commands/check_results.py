"""What `hotreload check` found: a `Step` per check, a `ModelReport` per model, and their
text (a line per step, the verdict) and JSON (`--json`) forms. check.py runs the checks."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.colour import paint, wants_colour
from hotreload.commands.check_progress import LiveProgress
from hotreload.errors import HotreloadError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_FAILURE, EXIT_OK, error_exit


@dataclass
class Step:
    """One check of one model: its verdict, how long it took, what it measured."""

    name: str
    ok: bool
    seconds: float
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    #: For a failure: what to look at.
    hint: str | None = None
    traceback: str | None = None


@dataclass
class ModelReport:
    """One model's checks; `environment_error` when its worker could not start at all."""

    model: str
    device: str = ""
    policy: str = ""
    strategy: str = ""
    steps: list[Step] = field(default_factory=list)
    environment_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.environment_error is None and all(s.ok for s in self.steps)


def format_step(s: Step, colour: bool = False) -> list[str]:
    """A step's result line, and for a failure what to look at and the traceback."""
    mark = paint("ok  ", "green", colour) if s.ok else paint("FAIL", "bold red", colour)
    lines = [f"  {mark} {s.name:<10} {s.seconds * 1000:8.0f} ms  {s.detail}"]
    if not s.ok:
        if s.hint:
            lines.append(f"       look at: {s.hint}")
        if s.traceback:
            lines.extend("       " + t for t in s.traceback.rstrip().splitlines()[-12:])
    return lines


def format_report(
    reports: list[ModelReport],
    total_s: float,
    cpu_note: str | None,
    colour: bool = False,
    steps: bool = True,
) -> str:
    """The text report; without `steps` only the note and the verdict (a terminal saw the
    steps as they ran)."""
    lines = []
    if cpu_note:
        lines.append(cpu_note)
    for r in reports if steps else ():
        where = f" on {r.device}" if r.device else ""
        lines.append(f"{r.model}{where} ({r.policy}, {r.strategy})")
        for s in r.steps:
            lines.extend(format_step(s, colour))
    passed = all(r.ok for r in reports)
    verdict = paint("PASS", "green", colour) if passed else paint("FAIL", "bold red", colour)
    failed = [r.model for r in reports if not r.ok]
    tail = "" if passed else f": {', '.join(failed)}"
    lines.append(f"hotreload check: {verdict}{tail} ({total_s:.1f} s)")
    return "\n".join(lines)


def report_json(reports: list[ModelReport], total_s: float, cpu_note: str | None) -> str:
    def finite(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    doc = {
        "ok": all(r.ok for r in reports),
        "total_s": total_s,
        "note": cpu_note,
        "models": [
            {
                "model": r.model,
                "ok": r.ok,
                "device": r.device,
                "policy": r.policy,
                "strategy": r.strategy,
                "environment_error": r.environment_error,
                "steps": [
                    {
                        "name": s.name,
                        "ok": s.ok,
                        "seconds": s.seconds,
                        "detail": s.detail,
                        "figures": {k: finite(v) for k, v in s.figures.items()},
                        "hint": s.hint,
                        "traceback": s.traceback,
                    }
                    for s in r.steps
                ],
            }
            for r in reports
        ],
    }
    return json.dumps(doc, indent=2)


Checks = Callable[["LiveProgress | None"], Coroutine[Any, Any, list[ModelReport]]]


def run_checks(
    checks: Checks,
    as_json: bool,
    config_path: Path | None,
    note: Callable[[list[ModelReport]], str | None] | None = None,
) -> int:
    """Run `checks` (given the live progress line on a terminal, None elsewhere), print
    their report (text or JSON, with `note(reports)` under it) and return the exit code:
    an environment error first, else whether every model passed."""
    colour = wants_colour(sys.stdout)
    progress = (
        LiveProgress(sys.stdout, lambda s: format_step(s, colour))
        if not as_json and sys.stdout.isatty()
        else None
    )
    t0 = time.monotonic()
    try:
        reports = asyncio.run(checks(progress))
    except HotreloadError as exc:  # a ConfigError here was checked against this machine
        return error_exit("hotreload check", exc, config_path)
    total = time.monotonic() - t0
    said = note(reports) if note is not None else None
    text = (
        report_json(reports, total, said)
        if as_json
        else format_report(reports, total, said, colour=colour, steps=progress is None)
    )
    print(text)
    if any(r.environment_error for r in reports):
        return EXIT_ENVIRONMENT
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILURE

"""`hotreload report` over logs that several runs appended to, and a waterfall with one
reload far longer than the rest (issue 31: merged sessions, a squashed waterfall)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hotreload.commands.report import read_log, render_html, waterfall, waterfall_scale

T0 = 1_796_000_000.0
HOUR = 3600.0


def _reload(ts: float, version: int, total_s: float, *, ok: bool = True) -> list[dict]:
    phase = "load" if ok else "warm"
    end = ts + total_s
    return [
        {
            "ts": end,
            "kind": "phase_end",
            "model": "mlp",
            "phase": phase,
            "duration_s": total_s,
            "ok": ok,
        },
        {
            "ts": end,
            "kind": "reload_done" if ok else "reload_failed",
            "model": "mlp",
            "version": version,
            "total_s": total_s,
            "trigger": "file",
            "phase": phase,
            "error": None if ok else "warm did not finish within its 60 s deadline",
        },
    ]


def _two_sessions(folder: Path) -> None:
    """Two runs of `hotreload watch` three hours apart, appended to the same two files."""
    events = [{"ts": T0, "kind": "session_started", "pid": 111, "socket": "s", "models": ["mlp"]}]
    events += _reload(T0 + 10, 2, 0.1) + _reload(T0 + 20, 3, 0.12)
    events.append({"ts": T0 + 30, "kind": "session_stopped"})
    t1 = T0 + 3 * HOUR
    events.append(
        {"ts": t1, "kind": "session_started", "pid": 222, "socket": "s", "models": ["mlp"]}
    )
    events += _reload(t1 + 5, 2, 0.09)
    events.append(
        {
            "ts": t1 + 40,
            "kind": "xid",
            "xid": 13,
            "name": "Graphics Engine Exception",
            "severity": "application",
            "phase": None,
        }
    )
    stats = [
        {
            "ts": T0 + i,
            "kind": "stats",
            "model": "mlp",
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "queue_depth": 0,
        }
        for i in range(1, 25)
    ]
    stats += [
        {
            "ts": t1 + i,
            "kind": "stats",
            "model": "mlp",
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "queue_depth": 1,
        }
        for i in range(1, 50)
    ]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "stats.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stats))


def test_each_session_gets_its_own_time_axis_and_says_which_it_is(tmp_path: Path) -> None:
    _two_sessions(tmp_path)
    log = read_log(tmp_path)
    first, second = log.sessions
    assert (first.pid, len(first.reloads), len(first.stats), len(first.xids)) == (111, 2, 24, 0)
    assert (second.pid, len(second.reloads), len(second.stats), len(second.xids)) == (222, 1, 49, 1)
    # Each axis spans its own session (seconds), not the three hours between them.
    assert first.end - first.start < 60 and second.end - second.start < 60
    page = render_html(log, "proj/hotreload.toml")
    assert "2 sessions in these logs, each on its own time axis" in page
    # Newest first, each named by its pid, each figure under its session's heading.
    s2, s1 = page.index("Session 2 (pid 222)</h2>"), page.index("Session 1 (pid 111)</h2>")
    assert s2 < s1
    assert "Graphics Engine Exception" in page[s2:s1]
    assert "Graphics Engine Exception" not in page[s1:]
    assert page[s2:s1].count("v2 ok") == 1 and "v3 ok" in page[s1:]


def test_one_session_reads_as_before(tmp_path: Path) -> None:
    events = [{"ts": T0, "kind": "session_started", "pid": 5, "socket": "s", "models": ["mlp"]}]
    events += _reload(T0 + 3, 2, 0.1)
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    page = render_html(read_log(tmp_path), "x")
    assert "sessions in these logs" not in page and "<h2>Reload phases</h2>" in page


def test_a_60_s_failure_does_not_squash_the_other_reloads(tmp_path: Path) -> None:
    events = [{"ts": T0, "kind": "session_started", "pid": 5, "socket": "s", "models": ["mlp"]}]
    for i in range(6):
        events += _reload(T0 + 10 * (i + 1), i + 2, 0.1 + 0.01 * i)
    events += _reload(T0 + 100, 8, 60.0, ok=False)
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    reloads = read_log(tmp_path).reloads
    assert waterfall_scale([r.total_s for r in reloads]) == pytest.approx(0.15)
    svg = waterfall(reloads)
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', svg)]
    # The usual reloads still read as bars (the widest spans the 640-unit width)...
    assert min(widths[:6]) > 400 and max(widths[:6]) <= 640.1
    # ...and the 60 s one is cut at the edge, its time written beside it.
    assert widths[6] <= 640.1 and "&#8811; 60.0 s" in svg
    assert "1 longer reload(s) are cut at the edge" in svg

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


def _lines(folder: Path, events: list[dict], stats: list[dict] | None = None) -> None:
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "stats.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stats or []))


def _run(t: float, pid: int) -> list[dict]:
    """One run of `hotreload watch` as it writes it: its start-up lines (CPUs, GPU, Xid
    sources) a few ms before `session_started`, a reload, and its stop."""
    return [
        {"ts": t - 0.03, "kind": "cpus", "serving": {}, "rest": [], "detail": "not pinned"},
        {"ts": t - 0.01, "kind": "gpu_unavailable", "reason": "NVML library not found"},
        {"ts": t - 0.01, "kind": "xid_sources", "sources": []},
        {"ts": t, "kind": "session_started", "pid": pid, "socket": "s", "models": ["mlp"]},
        *_reload(t + 2, 2, 0.1),
        {"ts": t + 3, "kind": "session_stopping"},
        {"ts": t + 3.1, "kind": "session_stopped"},
    ]


def test_start_up_lines_belong_to_their_session_which_ends_at_its_stop(tmp_path: Path) -> None:
    _lines(tmp_path, _run(T0, 111) + _run(T0 + HOUR, 222))
    log = read_log(tmp_path)
    # No empty "Session 1 (before the first recorded start)" of 0 s for the start-up lines.
    assert [s.pid for s in log.sessions] == [111, 222]
    first, second = log.sessions
    assert first.start == pytest.approx(T0 - 0.03) and second.start == pytest.approx(
        HOUR + T0 - 0.03
    )
    # The first run ends at its stop, not at the next run's start-up line an hour later.
    assert first.end == pytest.approx(T0 + 3.1)
    page = render_html(log, "x")
    assert "before the first recorded start" not in page
    assert "2 sessions in these logs" in page and "(3 s)" in page
    # No request figures: a note says so, not empty charts on a made-up 1.0 ms scale.
    assert "no request figures" in page and "1.0 ms" not in page


def test_lines_from_before_a_lost_start_still_read_as_their_own_session(tmp_path: Path) -> None:
    # A file whose first run's start line is gone: its reload and stop come first.
    events = [*_reload(T0, 2, 0.1), {"ts": T0 + 1, "kind": "session_stopped"}]
    _lines(tmp_path, events + _run(T0 + HOUR, 222))
    log = read_log(tmp_path)
    assert [(s.pid, len(s.reloads)) for s in log.sessions] == [(None, 1), (222, 1)]
    assert "Session 1 (before the first recorded start)" in render_html(log, "x")


def _back_to_back(t: float) -> list[dict]:
    """Two reloads as a file save and `hotreload reload` make them: the second starts a ms
    after the first's last phase (its digest) ended."""
    events = []
    for version, start in ((2, t), (3, t + 0.0505)):
        at = start + 0.003
        for phase, dur in (("load", 0.02), ("warm", 0.025), ("swap", 0.001), ("digest", 0.0005)):
            at += dur
            events.append(
                {"ts": at, "kind": "phase_end", "model": "mlp", "phase": phase,
                 "duration_s": dur, "ok": True}
            )  # fmt: skip
        events.append(
            {"ts": at + 0.0005, "kind": "reload_done", "model": "mlp", "version": version,
             "total_s": at + 0.0005 - start, "trigger": "file", "phases": {}}
        )  # fmt: skip
    return events


def test_each_reload_draws_only_its_own_phases(tmp_path: Path) -> None:
    _lines(tmp_path, _run(T0, 5)[:4] + _back_to_back(T0 + 1))
    first, second = read_log(tmp_path).reloads
    names = ["load", "warm", "swap", "digest"]
    assert [p for p, *_ in first.phases] == names and [p for p, *_ in second.phases] == names
    # The second's load starts 3 ms in, where it ran (not at 0 behind the first's digest).
    assert second.phases[0][1] == pytest.approx(0.003, abs=1e-6)


def test_the_waterfall_has_an_axis_and_its_legend_names_every_bar(tmp_path: Path) -> None:
    _lines(tmp_path, _run(T0, 5)[:4] + _back_to_back(T0 + 1))
    svg = waterfall(read_log(tmp_path).reloads)
    drawn = set(re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', svg))
    keys = set(re.findall(r'class="key" style="background:(#[0-9a-f]{6})"></span>(\w+)', svg))
    # Each colour drawn is in the legend, under its phase's name (digest too).
    assert drawn == {colour for colour, _ in keys}
    assert {name for _, name in keys} == {"load", "warm", "swap", "digest"}
    # Where a bar starts reads off an axis in ms from the reload's start, and the line under
    # the bars (the reload's whole time, the gap before its first phase) is explained.
    ticks = re.findall(r'class="tick" text-anchor="middle">([^<]+)</text>', svg)
    assert ticks == ["0", "10 ms", "20 ms", "30 ms", "40 ms", "50 ms"]
    assert "the whole reload: a gap is time outside any phase" in svg
    assert "the axis is the time since the reload began" in svg


def test_the_memory_chart_says_why_a_version_has_a_second_point(tmp_path: Path) -> None:
    events = _run(T0, 5)[:4] + _reload(T0 + 2, 2, 0.1)
    events.append(
        {"ts": T0 + 5, "kind": "reload_done", "model": "mlp", "version": 2, "total_s": 0.004,
         "trigger": "file", "phases": {}, "unchanged": "unchanged: nothing to reload"}
    )  # fmt: skip
    memory = [
        {"ts": T0 + ts, "kind": "memory", "model": "mlp", "version": v, "rss_bytes": 2**28}
        for ts, v in ((1, 1), (2.3, 2), (5.2, 2), (9, 2))
    ]
    _lines(tmp_path, events, memory)
    page = render_html(read_log(tmp_path), "x")
    chart = page[page.index("Memory after each reload") :]
    labels = re.findall(r'class="tick" text-anchor="middle">([^<]+)<tspan', chart)
    # A no-op save and a worker restart read the same version again: each point says which.
    assert labels == ["v1", "v2", "v2 (no change)", "v2 (restart)"]
    # The no-op save is no "v2 ok" row in the waterfall either.
    assert "mlp unchanged 4 ms" in page

"""`hotreload report [--html OUT]`: one self-contained HTML page from `.hotreload/`.

It draws what the session logged: each reload's phases as a waterfall; request latency and
queue depth over time with the reload windows shaded (`stats.jsonl`); memory after each
reload; Xid events on the same time axis. Inline SVG and CSS only: the file opens anywhere,
offline, and can be attached to a bug report.
"""

from __future__ import annotations

import html
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotreload.commands.report_log import Log, Reload, read_log
from hotreload.engine.eval_text import eval_text
from hotreload.engine.golden_text import summary as golden_summary
from hotreload.errors import HotreloadError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_OK, error_exit
from hotreload.paths import write_private_file

#: Colours the page draws with (the Chromium test looks for some of them in the picture);
#: the phases in the order a reload runs them, as the legend lists them.
PHASE_COLOURS = {
    "checkpoint": "#e17055",
    "lock": "#343a40",
    "spawn": "#8e44ad",
    "load": "#2e86de",
    "warm": "#10ac84",
    "smoke": "#f6b93b",
    "gate": "#576574",
    "drain": "#00a8b5",
    "sync": "#5f27cd",
    "swap": "#ee5253",
    "resume": "#8395a7",
    "release": "#c8d6e5",
    "digest": "#e84393",
}
OTHER_PHASE = "#999999"  # a phase this page has no colour for: the legend names it
TRACK = "#adb5bd"  # the line under a reload's bars: its whole time, gaps included
RELOAD_WINDOW = "#ffd8a8"  # shaded behind latency and queue charts
FAILED_WINDOW = "#ffc9c9"
XID_MARK = "#e03131"
P99_LINE = "#e8590c"
P50_LINE = "#1c7ed6"
QUEUE_LINE = "#2f9e44"
MEMORY_DOT = "#7048e8"

WIDTH = 1000  # SVG user units: charts scale to the page width


# ----------------------------------------------------------------------------- drawing


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


class TimeAxis:
    """Session time to SVG x, shared by every time chart so they line up."""

    def __init__(self, start: float, end: float, left: float = 60, right: float = 10) -> None:
        self.start, self.span = start, max(end - start, 1e-3)
        self.left, self.width = left, WIDTH - left - right

    def x(self, ts: float) -> float:
        return self.left + (ts - self.start) / self.span * self.width

    def ticks(self, height: float) -> str:
        out = []
        for i in range(6):
            ts = self.start + self.span * i / 5
            x = self.x(ts)
            # The last label ends at its tick: centred, it would run off the page's edge.
            anchor = "end" if i == 5 else "middle"
            out.append(
                f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" class="grid"/>'
                f'<text x="{x:.1f}" y="{height + 14}" class="tick" text-anchor="{anchor}">'
                f"{_hms(ts)}</text>"
            )
        return "".join(out)


def _windows(log: Log, axis: TimeAxis, height: float) -> str:
    """Reload windows (shaded) and Xid events (red lines) behind a time chart."""
    out = []
    for r in log.reloads:
        x0, x1 = axis.x(r.started), axis.x(r.started + r.total_s)
        colour = RELOAD_WINDOW if r.ok else FAILED_WINDOW
        out.append(
            f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 3):.1f}" height="{height}" '
            f'fill="{colour}"><title>{_esc(r.model)} reload to v{r.version}: '
            f"{'ok' if r.ok else 'FAILED'} in {r.total_s:.2f} s</title></rect>"
        )
    for x in log.xids:
        px = axis.x(float(x["ts"]))
        out.append(
            f'<line x1="{px:.1f}" y1="0" x2="{px:.1f}" y2="{height}" stroke="{XID_MARK}" '
            f'stroke-width="3"><title>Xid {_esc(x.get("xid"))} {_esc(x.get("name"))}</title></line>'
        )
    return "".join(out)


def _line(points: list[tuple[float, float]], colour: str, label: str) -> str:
    if not points:
        return ""
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (
        f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="3">'
        f"<title>{_esc(label)}</title></polyline>"
    )


def time_chart(log: Log, axis: TimeAxis, series: list[tuple[str, str, str]], unit: str) -> str:
    """An SVG of `series` (stats key, colour, label) over time, reload windows shaded."""
    height = 180.0
    values = [float(s.get(key) or 0) for key, _, _ in series for s in log.stats]
    top = max(values, default=0.0) or 1.0
    lines = []
    for key, colour, label in series:
        pts = [
            (axis.x(float(s["ts"])), height - float(s.get(key) or 0) / top * (height - 10))
            for s in log.stats
        ]
        lines.append(_line(pts, colour, label))
    legend = " ".join(
        f'<span class="key" style="background:{c}"></span>{_esc(label)}' for _, c, label in series
    )
    return (
        f'<svg viewBox="0 0 {WIDTH} {height + 24}" class="chart">'
        f"{_windows(log, axis, height)}{axis.ticks(height)}"
        f'<text x="4" y="12" class="tick">{top:.1f} {unit}</text>'
        f'<text x="4" y="{height}" class="tick">0</text>'
        f'{"".join(lines)}</svg><p class="legend">{legend}</p>'
    )


#: A reload this many times the median is drawn cut at the edge, not as the scale: one 60 s
#: deadline failure would otherwise shrink every 100 ms reload to a pixel.
OUTLIER_RATIO = 4.0


def waterfall_scale(totals: list[float]) -> float:
    """The duration the waterfall's width stands for: the longest reload that is not an
    outlier (over OUTLIER_RATIO times the median)."""
    ordered = sorted(totals)
    if not ordered:
        return 1e-3
    median = ordered[(len(ordered) - 1) // 2]  # the lower one: of two, the usual one
    usual = [t for t in ordered if t <= OUTLIER_RATIO * median]
    return max(usual[-1] if usual else ordered[-1], 1e-3)


def _duration(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def _round_ticks(scale: float) -> list[float]:
    """0 and round times (1, 2 or 5 times a power of ten) up to `scale`, at most 7 of them."""
    step = 10.0 ** math.floor(math.log10(scale))
    for mult in (0.1, 0.2, 0.5, 1.0, 2.0, 5.0):
        if scale / (step * mult) <= 6:
            step *= mult
            break
    return [i * step for i in range(int(scale / step * 1.0001) + 1)]


def waterfall(reloads: list[Reload]) -> str:
    """One row per reload (newest last), each phase a bar where it ran in the reload, on a
    line for the reload's whole time, over an axis of the time since each reload began."""
    if not reloads:
        return '<p class="none">no reload in this session</p>'
    shown = reloads[-40:]
    # A reload that found nothing to build takes a few ms: it sets the scale only alone.
    built = [r.total_s for r in shown if not r.unchanged]
    scale = waterfall_scale(built or [r.total_s for r in shown])
    row, left, width = 22, 260, WIDTH - 360  # room on the right for a cut bar's time
    bottom = len(shown) * row
    out = []
    for at in _round_ticks(scale):  # the axis first: the bars draw over its grid
        x = left + at / scale * width
        out.append(
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{bottom}" class="grid"/>'
            f'<text x="{x:.1f}" y="{bottom + 14}" class="tick" text-anchor="middle">'
            f"{_duration(at) if at else '0'}</text>"
        )
    drawn: dict[str, str] = {}
    for i, r in enumerate(shown):
        y = i * row
        status = "unchanged" if r.unchanged else f"v{r.version} ok" if r.ok else "FAILED"
        if r.rollback_of:  # a kept version served again: which one
            status = f"rollback to v{r.rollback_of}: {status}"
        out.append(
            f'<text x="0" y="{y + 15}" class="label">{_hms(r.started)} {_esc(r.model)} '
            f"{status} {r.total_s * 1000:.0f} ms</text>"
        )
        end = left + min(r.total_s, scale) / scale * width
        out.append(
            f'<line x1="{left}" y1="{y + row / 2}" x2="{end:.1f}" y2="{y + row / 2}" '
            f'stroke="{TRACK}" stroke-width="2"><title>the whole reload, '
            f"{r.total_s * 1000:.1f} ms</title></line>"
        )
        for phase, offset, dur, ok in r.phases:
            if offset >= scale:
                continue
            x = left + offset / scale * width
            w = max(min(dur, scale - offset) / scale * width, 1.5)
            colour = drawn.setdefault(phase, PHASE_COLOURS.get(phase, OTHER_PHASE))
            edge = f' stroke="{XID_MARK}" stroke-width="3"' if not ok else ""
            out.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                f'fill="{colour}"{edge}><title>{_esc(phase)} {dur * 1000:.1f} ms, from '
                f"{offset * 1000:.1f} ms</title></rect>"
            )
        if r.total_s > scale * 1.001:
            out.append(
                f'<text x="{left + width + 4}" y="{y + 15}" class="cut">'
                f"&#8811; {r.total_s:.1f} s</text>"
            )
    # The phases drawn, in the order they run (an unknown one last, named all the same).
    order = [p for p in PHASE_COLOURS if p in drawn] + [p for p in drawn if p not in PHASE_COLOURS]
    legend = " ".join(
        f'<span class="key" style="background:{drawn[p]}"></span>{_esc(p)}' for p in order
    )
    if any(not ok for r in shown for *_, ok in r.phases):
        legend += (
            f' <span class="key" style="border:2px solid {XID_MARK}"></span>the phase that failed'
        )
    cut = sum(r.total_s > scale * 1.001 for r in shown)
    note = (
        f"the width is {scale * 1000:.0f} ms; {cut} longer reload(s) are cut at the edge, "
        "their time written beside them"
        if cut
        else f"the longest reload spans the width, {scale * 1000:.0f} ms"
    )
    return (
        f'<svg viewBox="0 0 {WIDTH} {bottom + 20}" class="chart">{"".join(out)}</svg>'
        f'<p class="legend">{legend} <span class="track"></span>the whole reload: a gap '
        "is time outside any phase (the snapshot of the code, choosing a policy)</p>"
        f'<p class="legend">Bars to scale: {note}; the axis is the time since the reload '
        "began.</p>"
    )


def _memory_labels(memory: list[dict[str, Any]], reloads: Sequence[Reload]) -> list[str]:
    """A point's label: its version (and model, with several), and why a version has a
    second reading: a reload that found nothing to build, else a restart of its worker
    (each reading follows a reload or a start; a reload has one)."""
    several = len({m.get("model") for m in memory}) > 1
    seen: set[tuple[Any, Any]] = set()
    read_after: set[int] = set()  # the reloads a reading followed
    labels = []
    for m in memory:
        key = (m.get("model"), m.get("version"))
        label = f"{m.get('model')} v{m.get('version')}" if several else f"v{m.get('version')}"
        ended = [
            i
            for i, r in enumerate(reloads)
            if r.model == key[0] and r.started + r.total_s <= m["ts"]
        ]
        follows = ended[-1] if ended and ended[-1] not in read_after else None
        if key in seen:
            unchanged = follows is not None and reloads[follows].unchanged
            label += " (no change)" if unchanged else " (restart)"
        if follows is not None:
            read_after.add(follows)
        seen.add(key)
        labels.append(label)
    return labels


def memory_chart(memory: list[dict[str, Any]], reloads: Sequence[Reload] = ()) -> str:
    if not memory:
        return '<p class="none">no memory reading (recorded after each reload)</p>'
    figures = [
        (m, float(m.get("allocated_bytes") or m.get("rss_bytes") or 0) / 2**20) for m in memory
    ]
    top = max(v for _, v in figures) or 1.0
    height, step = 160.0, (WIDTH - 80) / max(len(figures), 1)
    timed = len(figures) <= 12  # room under each point for its time of day
    out = []
    for i, ((m, mib), label) in enumerate(
        zip(figures, _memory_labels(memory, reloads), strict=True)
    ):
        x, y = 60 + (i + 0.5) * step, height - mib / top * (height - 20)
        when = f'<tspan x="{x:.1f}" dy="13">{_hms(float(m["ts"]))}</tspan>' if timed else ""
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{MEMORY_DOT}">'
            f"<title>{_esc(label)} at {_hms(float(m['ts']))}: {mib:.1f} MiB</title></circle>"
            f'<text x="{x:.1f}" y="{height + 16}" class="tick" text-anchor="middle">'
            f"{_esc(label)}{when}</text>"
        )
        if timed:
            out.append(
                f'<text x="{x:.1f}" y="{y - 10:.1f}" class="tick" text-anchor="middle">'
                f"{mib:.{0 if mib >= 10 else 1}f} MiB</text>"
            )
    kind = "torch allocated" if any(m.get("allocated_bytes") for m in memory) else "worker RSS"
    grown = figures[-1][1] - figures[0][1]
    return (
        f'<svg viewBox="0 0 {WIDTH} {height + (37 if timed else 24)}" class="chart">'
        f'<text x="4" y="14" class="tick">{top:.0f} MiB</text>'
        f'<text x="4" y="{height}" class="tick">0</text>{"".join(out)}</svg>'
        f'<p class="legend">{kind} after each version went live ({grown:+.1f} MiB from the '
        "first reading to the last): a climb across reloads is a leak</p>"
    )


def xid_table(xids: list[dict[str, Any]]) -> str:
    if not xids:
        return '<p class="none">no Xid event in this log</p>'
    rows = "".join(
        f"<tr><td>{_hms(float(x['ts']))}</td><td>{_esc(x.get('xid'))}</td>"
        f"<td>{_esc(x.get('name'))}</td><td>{_esc(x.get('severity'))}</td>"
        f"<td>{_esc(x.get('phase') or '-')}</td><td>{_esc(x.get('action') or '')}</td></tr>"
        for x in xids
    )
    return (
        "<table><tr><th>time</th><th>Xid</th><th>name</th><th>severity</th><th>reload phase</th>"
        f"<th>what to do</th></tr>{rows}</table>"
    )


def eval_table(evals: Sequence[dict[str, Any]]) -> str:
    """Per version scored by the config's `eval`: its figures, or why it has none."""
    rows = "".join(
        f"<tr><td>{_hms(float(e['ts']))}</td><td>{_esc(e.get('model'))}</td>"
        f"<td>v{_esc(e.get('version'))}</td><td>{_esc(eval_text(e))}</td></tr>"
        for e in evals
    )
    if not rows:
        return (
            '<p class="none">no eval (set eval = "evals.py:score" in a model\'s section to '
            "score each new version)</p>"
        )
    return f"<table><tr><th>time</th><th>model</th><th>version</th><th>eval</th></tr>{rows}</table>"


def golden_table(reloads: Sequence[Reload]) -> str:
    """Per reload that compared golden outputs: from, to, and what changed (the largest
    absolute difference per output, top-1 flips, a generator's first differing token)."""
    rows = "".join(
        f"<tr><td>{_hms(r.started + r.total_s)}</td><td>{_esc(r.model)}</td>"
        f"<td>v{_esc(r.golden.get('from'))} &rarr; v{_esc(r.golden.get('to'))}</td>"
        f"<td>{'identical' if r.golden.get('identical') else 'changed'}</td>"
        f"<td>{_esc(golden_summary(r.golden))}</td></tr>"
        for r in reloads
        if r.golden
    )
    if not rows:
        return (
            '<p class="none">no golden comparison (a reload compares the example and '
            "the config's golden inputs with the version before)</p>"
        )
    return (
        "<table><tr><th>time</th><th>model</th><th>versions</th><th>outputs</th>"
        f"<th>what changed</th></tr>{rows}</table>"
    )


CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.chart { width: 100%; height: auto; display: block; }
.grid { stroke: #e9ecef; } .tick { font-size: 11px; fill: #666; } .label { font-size: 12px; }
.cut { font-size: 12px; fill: #c92a2a; } .session { border-top: 2px solid #ced4da; }
.legend, .none { color: #666; font-size: 12px; }
.key { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; }
.track { display: inline-block; width: 16px; height: 2px; margin: 0 3px 3px 10px;
  background: #adb5bd; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; }
"""


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _counts(log: Log) -> str:
    failed = sum(not r.ok for r in log.reloads)
    return (
        f"{len(log.reloads)} reload(s), {failed} failed; {len(log.xids)} Xid event(s); "
        f"{len(log.stats)} request figure(s)"
    )


def _session_name(log: Log, number: int) -> str:
    who = f"pid {log.pid}" if log.pid is not None else "before the first recorded start"
    return f"Session {number} ({who})"


def session_html(log: Log, heading: str = "", anchor: str = "") -> str:
    """One session's charts, on its own time axis."""
    axis = TimeAxis(log.start, log.end)
    # Without figures a chart would be empty axes (and a made-up 1.0 scale): say so instead.
    latency = queue = (
        '<p class="none">no request figures (stats.jsonl): send requests while it runs</p>'
    )
    if log.stats:
        latency = time_chart(
            log, axis, [("p99_ms", P99_LINE, "p99"), ("p50_ms", P50_LINE, "p50")], "ms"
        )
        queue = time_chart(log, axis, [("queue_depth", QUEUE_LINE, "queued")], "requests")
    span = f"{_when(log.start)} to {_hms(log.end)} ({log.end - log.start:.0f} s)"
    top = f'<h2 id="{anchor}" class="session">{_esc(heading)}</h2>' if heading else ""
    level = "h3" if heading else "h2"
    return f"""{top}<p>{_esc(span)}: {_esc(_counts(log))}.</p>
<{level}>Reload phases</{level}>{waterfall(log.reloads)}
<{level}>Golden outputs</{level}>{golden_table(log.reloads)}
<{level}>Evals</{level}>{eval_table(log.evals)}
<{level}>Request latency (per second)</{level}>{latency}
<{level}>Queue depth</{level}>{queue}
<{level}>Memory after each reload</{level}>{memory_chart(log.memory, log.reloads)}
<{level}>Xid events</{level}>{xid_table(log.xids)}
"""


def render_html(log: Log, title: str) -> str:
    sessions = log.sessions or [log]
    if len(sessions) == 1:
        body = session_html(sessions[0])
    else:
        # Newest first: the run a user just stopped is the one they came to read.
        numbered = list(enumerate(sessions, 1))[::-1]
        rows = "".join(
            f'<tr><td><a href="#session-{n}">{_esc(_session_name(s, n))}</a></td>'
            f"<td>{_when(s.start)}</td><td>{_hms(s.end)}</td><td>{_esc(_counts(s))}</td></tr>"
            for n, s in numbered
        )
        body = (
            f"<p>{len(sessions)} sessions in these logs, each on its own time axis, newest "
            "first.</p><table><tr><th>session</th><th>from</th><th>to</th><th>what it logged"
            f"</th></tr>{rows}</table>"
        ) + "".join(session_html(s, _session_name(s, n), f"session-{n}") for n, s in numbered)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>hotreload report: {_esc(title)}</title>
<style>{CSS}</style></head><body>
<h1>hotreload report: {_esc(title)}</h1>
<p>Shaded: reload windows (red: failed). Red lines: Xid events.</p>
{body}</body></html>
"""


def report_main(config_path: str | None, html_out: str | None) -> int:
    from hotreload.config import load_config
    from hotreload.errors import ConfigError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        return error_exit("hotreload report", exc)
    state_dir = config.state_dir
    if not (state_dir / "events.jsonl").is_file():
        print(
            f"hotreload report: no {state_dir / 'events.jsonl'} yet: run `hotreload watch` "
            "(or serve) first",
            file=sys.stderr,
        )
        return EXIT_ENVIRONMENT
    log = read_log(state_dir)
    out = Path(html_out) if html_out else state_dir / "report.html"
    try:
        # 0600 like the rest of the state folder: the page holds tracebacks and code paths.
        write_private_file(out, render_html(log, str(config.path)))
    except (OSError, HotreloadError) as exc:
        print(f"hotreload report: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    failed = sum(not r.ok for r in log.reloads)
    sessions = len(log.sessions) if len(log.sessions) > 1 else 0
    print(
        f"wrote {out}: {len(log.reloads)} reload(s) ({failed} failed), "
        f"{len(log.stats)} request figure(s), {len(log.xids)} Xid event(s)"
        + (f" from {sessions} sessions, each on its own time axis" if sessions else "")
    )
    return EXIT_OK

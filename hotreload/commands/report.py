"""`hotreload report [--html OUT]`: one self-contained HTML page from `.hotreload/`.

It draws what the session logged: each reload's phases as a waterfall; request latency and
queue depth over time with the reload windows shaded (`stats.jsonl`); memory after each
reload; Xid events on the same time axis. Inline SVG and CSS only: the file opens anywhere,
offline, and can be attached to a bug report.
"""

from __future__ import annotations

import html
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.engine.event_kinds import PhaseEnd, ReloadDone, ReloadFailed, SessionStarted, Xid
from hotreload.engine.events import typed
from hotreload.engine.stats_log import STATS_FILE
from hotreload.errors import HotreloadError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_OK, error_exit
from hotreload.paths import write_private_file

#: Colours the page draws with (the Chromium test looks for some of them in the picture).
PHASE_COLOURS = {
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
}
OTHER_PHASE = "#999999"
RELOAD_WINDOW = "#ffd8a8"  # shaded behind latency and queue charts
FAILED_WINDOW = "#ffc9c9"
XID_MARK = "#e03131"
P99_LINE = "#e8590c"
P50_LINE = "#1c7ed6"
QUEUE_LINE = "#2f9e44"
MEMORY_DOT = "#7048e8"

WIDTH = 1000  # SVG user units: charts scale to the page width


@dataclass
class Reload:
    model: str
    ok: bool
    version: int
    started: float
    total_s: float
    trigger: str
    error: str | None
    #: (phase, start offset s, duration s, ok) in the order the phases ran.
    phases: list[tuple[str, float, float, bool]] = field(default_factory=list)


@dataclass
class Log:
    reloads: list[Reload]
    stats: list[dict[str, Any]]
    memory: list[dict[str, Any]]
    xids: list[dict[str, Any]]
    start: float
    end: float
    #: The session's pid (from its `session_started`), None for lines from before one.
    pid: int | None = None
    #: One Log per session the files hold (each `session_started` opens one), oldest first;
    #: empty on a Log that is itself one session.
    sessions: list[Log] = field(default_factory=list)

    def window(self, start: float, end: float, pid: int | None, times: Sequence[float] = ()) -> Log:
        """What happened in [start, end): one session of the files, on its own times.
        `times`: every line's time, so a session's axis ends at its last line of any kind."""

        def inside(ts: float) -> bool:
            return start <= ts < end

        stats = [s for s in self.stats if inside(float(s["ts"]))]
        memory = [m for m in self.memory if inside(float(m["ts"]))]
        xids = [x for x in self.xids if inside(float(x["ts"]))]
        reloads = [r for r in self.reloads if inside(r.started + r.total_s)]
        seen = [start] + [t for t in times if inside(t)]
        seen += [float(x["ts"]) for x in (*stats, *memory, *xids)]
        last = min(max(seen + [r.started + r.total_s for r in reloads]), end)
        return Log(reloads, stats, memory, xids, start, max(last, start), pid=pid)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash or a full disk
        if isinstance(row, dict) and isinstance(row.get("ts"), (int, float)):
            rows.append(row)
    return rows


def read_log(state_dir: Path) -> Log:
    events = _read_jsonl(state_dir / "events.jsonl")
    samples = _read_jsonl(state_dir / STATS_FILE)
    # The events as their classes (engine/event_kinds.py), each with its time.
    seen = [(float(e["ts"]), ev) for e in events if (ev := typed(e)) is not None]
    phase_ends = [(ts, p) for ts, p in seen if isinstance(p, PhaseEnd)]
    reloads = []
    for end, e in seen:
        if not isinstance(e, (ReloadDone, ReloadFailed)):
            continue
        total = float(e.total_s or 0.0)
        r = Reload(
            model=e.model,
            ok=isinstance(e, ReloadDone),
            version=int(e.version or 0),
            started=end - total,
            total_s=total,
            trigger=e.trigger or "",
            error=e.error,
        )
        for ts, p in phase_ends:
            dur = float(p.duration_s or 0.0)
            if p.model == r.model and r.started - 0.01 <= ts - dur and ts <= end + 0.01:
                offset = max(0.0, ts - dur - r.started)
                r.phases.append((p.phase, offset, dur, p.ok is not False))
        reloads.append(r)
    times = [float(e["ts"]) for e in events] + [float(s["ts"]) for s in samples]
    log = Log(
        reloads=reloads,
        stats=[s for s in samples if s.get("kind") == "stats"],
        memory=[s for s in samples if s.get("kind") == "memory"],
        xids=[e for e in events if isinstance(typed(e), Xid)],
        start=min(times, default=0.0),
        end=max(times, default=0.0),
    )
    # Both files grow across runs of watch and serve: one time axis over all of them would
    # squash each run into a sliver beside the hours between them. Each session_started
    # opens a session that lasts until the next one.
    starts = [(ts, getattr(e, "pid", None)) for ts, e in seen if isinstance(e, SessionStarted)]
    if starts and log.start < starts[0][0]:
        starts.insert(0, (log.start, None))  # lines from before the first recorded start
    bounds = [ts for ts, _ in starts[1:]] + [log.end + 1.0]
    log.sessions = [
        log.window(ts, end, pid, times) for (ts, pid), end in zip(starts, bounds, strict=True)
    ]
    return log


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


def waterfall(reloads: list[Reload]) -> str:
    """One row per reload (newest last), each phase a bar where it ran in the reload."""
    if not reloads:
        return '<p class="none">no reload in this session</p>'
    shown = reloads[-40:]
    scale = waterfall_scale([r.total_s for r in shown])
    row, left, width = 22, 260, WIDTH - 360  # room on the right for a cut bar's time
    out = []
    for i, r in enumerate(shown):
        y = i * row
        status = f"v{r.version} ok" if r.ok else "FAILED"
        out.append(
            f'<text x="0" y="{y + 15}" class="label">{_hms(r.started)} {_esc(r.model)} '
            f"{status} {r.total_s * 1000:.0f} ms</text>"
        )
        for phase, offset, dur, ok in r.phases:
            if offset >= scale:
                continue
            x = left + offset / scale * width
            w = max(min(dur, scale - offset) / scale * width, 1.5)
            colour = PHASE_COLOURS.get(phase, OTHER_PHASE)
            edge = f' stroke="{XID_MARK}" stroke-width="3"' if not ok else ""
            out.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                f'fill="{colour}"{edge}><title>{_esc(phase)} {dur * 1000:.1f} ms</title></rect>'
            )
        if r.total_s > scale * 1.001:
            out.append(
                f'<text x="{left + width + 4}" y="{y + 15}" class="cut">'
                f"&#8811; {r.total_s:.1f} s</text>"
            )
    legend = " ".join(
        f'<span class="key" style="background:{c}"></span>{p}' for p, c in PHASE_COLOURS.items()
    )
    cut = sum(r.total_s > scale * 1.001 for r in shown)
    note = (
        f"the width is {scale * 1000:.0f} ms; {cut} longer reload(s) are cut at the edge, "
        "their time written beside them"
        if cut
        else f"the longest reload spans the width, {scale * 1000:.0f} ms"
    )
    return (
        f'<svg viewBox="0 0 {WIDTH} {len(shown) * row + 4}" class="chart">{"".join(out)}</svg>'
        f'<p class="legend">{legend} (bars to scale: {note})</p>'
    )


def memory_chart(memory: list[dict[str, Any]]) -> str:
    if not memory:
        return '<p class="none">no memory reading (recorded after each reload)</p>'
    figures = [
        (m, float(m.get("allocated_bytes") or m.get("rss_bytes") or 0) / 2**20) for m in memory
    ]
    top = max(v for _, v in figures) or 1.0
    height, step = 160.0, (WIDTH - 80) / max(len(figures), 1)
    out = []
    for i, (m, mib) in enumerate(figures):
        x, y = 60 + (i + 0.5) * step, height - mib / top * (height - 20)
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{MEMORY_DOT}">'
            f"<title>{_esc(m.get('model'))} v{_esc(m.get('version'))}: {mib:.1f} MiB</title>"
            f'</circle><text x="{x:.1f}" y="{height + 16}" class="tick" text-anchor="middle">'
            f"v{_esc(m.get('version'))}</text>"
        )
    kind = "torch allocated" if any(m.get("allocated_bytes") for m in memory) else "worker RSS"
    grown = figures[-1][1] - figures[0][1]
    return (
        f'<svg viewBox="0 0 {WIDTH} {height + 24}" class="chart">'
        f'<text x="4" y="14" class="tick">{top:.0f} MiB</text>{"".join(out)}</svg>'
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


CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.chart { width: 100%; height: auto; display: block; }
.grid { stroke: #e9ecef; } .tick { font-size: 11px; fill: #666; } .label { font-size: 12px; }
.cut { font-size: 12px; fill: #c92a2a; } .session { border-top: 2px solid #ced4da; }
.legend, .none { color: #666; font-size: 12px; }
.key { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; }
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
    latency = time_chart(
        log, axis, [("p99_ms", P99_LINE, "p99"), ("p50_ms", P50_LINE, "p50")], "ms"
    )
    queue = time_chart(log, axis, [("queue_depth", QUEUE_LINE, "queued")], "requests")
    no_stats = (
        ""
        if log.stats
        else '<p class="none">no request figures (stats.jsonl): send requests while it runs</p>'
    )
    span = f"{_when(log.start)} to {_hms(log.end)} ({log.end - log.start:.0f} s)"
    top = f'<h2 id="{anchor}" class="session">{_esc(heading)}</h2>' if heading else ""
    level = "h3" if heading else "h2"
    return f"""{top}<p>{_esc(span)}: {_esc(_counts(log))}.</p>
<{level}>Reload phases</{level}>{waterfall(log.reloads)}
<{level}>Request latency (per second)</{level}>{no_stats}{latency}
<{level}>Queue depth</{level}>{queue}
<{level}>Memory after each reload</{level}>{memory_chart(log.memory)}
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

"""What `hotreload report` reads: the session's `.hotreload/events.jsonl` and stats file as
reloads (each with its own phases), samples and Xids, cut into one `Log` per session run.
The drawing is report.py's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.engine.event_kinds import (
    BaseEvent,
    EvalDone,
    PhaseEnd,
    ReloadDone,
    ReloadFailed,
    SessionStarted,
    SessionStopped,
    Xid,
)
from hotreload.engine.events import typed
from hotreload.engine.stats_log import STATS_FILE


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
    #: Nothing was built: the code and weights were the serving version's.
    unchanged: bool = False
    #: How its golden outputs differed from the version before (ReloadDone.golden).
    golden: dict[str, Any] | None = None
    #: A rollback: the kept version it served again (ReloadDone.rollback_of).
    rollback_of: int | None = None


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
    #: Each version's eval (`eval_done`: model, version, figures or error, ts), in order.
    evals: list[dict[str, Any]] = field(default_factory=list)

    def window(self, start: float, end: float, pid: int | None, times: Sequence[float] = ()) -> Log:
        """What happened in [start, end): one session of the files, on its own times.
        `times`: every line's time, so a session's axis ends at its last line of any kind."""

        def inside(ts: float) -> bool:
            return start <= ts < end

        stats = [s for s in self.stats if inside(float(s["ts"]))]
        memory = [m for m in self.memory if inside(float(m["ts"]))]
        xids = [x for x in self.xids if inside(float(x["ts"]))]
        reloads = [r for r in self.reloads if inside(r.started + r.total_s)]
        evals = [e for e in self.evals if inside(float(e["ts"]))]
        seen = [start] + [t for t in times if inside(t)]
        seen += [float(x["ts"]) for x in (*stats, *memory, *xids)]
        last = min(max(seen + [r.started + r.total_s for r in reloads]), end)
        return Log(reloads, stats, memory, xids, start, max(last, start), pid=pid, evals=evals)


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
    # The events as their classes (engine/event_kinds.py), each with its time, in file order.
    seen = [ev for e in events if (ev := typed(e)) is not None]
    reloads = []
    since: dict[str, int] = {}  # model -> index in `seen` just after its last reload's end
    for i, e in enumerate(seen):
        if not isinstance(e, (ReloadDone, ReloadFailed)):
            continue
        total = float(e.total_s or 0.0)
        r = Reload(
            model=e.model,
            ok=isinstance(e, ReloadDone),
            version=int(e.version or 0),
            started=e.ts - total,
            total_s=total,
            trigger=e.trigger or "",
            error=e.error,
            unchanged=bool(getattr(e, "unchanged", None)),
            golden=getattr(e, "golden", None),
            rollback_of=getattr(e, "rollback_of", None),
        )
        # Its phases: those of its model since the model's previous reload ended. A time
        # window alone took the previous reload's last phase (its digest, a ms earlier).
        for p in seen[since.get(r.model, 0) : i]:
            if not isinstance(p, PhaseEnd) or p.model != r.model:
                continue
            dur = float(p.duration_s or 0.0)
            if r.started - 0.01 <= p.ts - dur and p.ts <= e.ts + 0.01:
                r.phases.append((p.phase, max(0.0, p.ts - dur - r.started), dur, p.ok is not False))
        since[r.model] = i + 1
        reloads.append(r)
    times = [float(e["ts"]) for e in events] + [float(s["ts"]) for s in samples]
    log = Log(
        reloads=reloads,
        stats=[s for s in samples if s.get("kind") == "stats"],
        memory=[s for s in samples if s.get("kind") == "memory"],
        xids=[e for e in events if isinstance(typed(e), Xid)],
        evals=[e for e in events if isinstance(typed(e), EvalDone)],
        start=min(times, default=0.0),
        end=max(times, default=0.0),
    )
    # Both files grow across runs of watch and serve: one time axis over all of them would
    # squash each run into a sliver beside the hours between them.
    log.sessions = [
        log.window(begin, end, pid, times) for begin, end, pid in _session_bounds(seen, log)
    ]
    return log


def _session_bounds(seen: list[BaseEvent], log: Log) -> list[tuple[float, float, int | None]]:
    """(begin, end, pid) of each session. A session writes its start-up lines (CPUs, GPU,
    Xid sources, HTTP) just before its `session_started`: it begins at the first line after
    the previous session's `session_stopped` (at its own `session_started` after a crash,
    which wrote no stop), and the first one at the files' first line."""
    starts: list[tuple[float, int | None]] = []
    after_stop: float | None = log.start  # where lines that open a session begin
    for i, e in enumerate(seen):
        if isinstance(e, SessionStopped):
            after_stop = seen[i + 1].ts if i + 1 < len(seen) else None
        elif isinstance(e, SessionStarted):
            starts.append((e.ts if after_stop is None else min(after_stop, e.ts), e.pid))
            after_stop = None
    if not starts or log.start < starts[0][0]:
        starts.insert(0, (log.start, None))  # lines from before the first recorded start
    ends = [begin for begin, _ in starts[1:]] + [log.end + 1.0]
    return [(begin, end, pid) for (begin, pid), end in zip(starts, ends, strict=True)]

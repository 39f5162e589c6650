"""Plain mode: one readable line per event (serve, `watch --no-tui`, logs, CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from hotreload.colour import paint, wants_colour
from hotreload.engine import event_kinds as ev
from hotreload.engine.compile_figures import compile_text
from hotreload.engine.golden_text import summary as golden_summary
from hotreload.engine.telemetry import describe_xid_sources

#: The colour of an event's first line in a terminal (a traceback below it is dimmed).
EVENT_STYLES: dict[type[ev.BaseEvent], str] = {
    ev.Ready: "green",
    ev.ReloadDone: "green",
    ev.WorkerRestarted: "green",
    ev.StartFailed: "bold red",
    ev.ReloadFailed: "bold red",
    ev.RestartFailed: "red",
    ev.Wedged: "bold red",
    ev.WorkerDied: "red",
    ev.ConfigError: "red",
    ev.WatchError: "red",
    ev.SnapshotRewritten: "yellow",
    ev.CpusFailed: "yellow",
    ev.WatchPaused: "yellow",
    ev.WatchWaiting: "yellow",
}


#: A formatter takes the event of the class it is filed under (FORMATTERS): `Any` here, as
#: a mapping cannot tie each value's parameter to its key.
Formatter = Callable[[Any], str]


def _plural(n: int) -> str:
    return f"{n} change{'s' if n != 1 else ''}"


def _with_traceback(text: str, traceback: str | None) -> str:
    return text + ("\n" + traceback.rstrip() if traceback else "")


def _ready(e: ev.Ready) -> str:
    return (
        f"{e.model}: v{e.version} ready on {e.device} "
        f"(load {e.load_s:.2f} s, warm-up {e.warm_s:.2f} s, worker pid {e.pid})"
        + (f"; inputs {e.inputs}" if e.inputs else "")
        + _weights(e.digest)
    )


def _weights(digest: str | None) -> str:
    """`; weights sha256:d513bd5d`: which weights serve (the digest's first 8 hex digits;
    the whole one is in `hotreload status` and each reply)."""
    return f"; weights {digest[:15]}" if isinstance(digest, str) else ""


def _standby_ready(e: ev.StandbyReady) -> str:
    how = f" (kept after {e.after or 'serving'})" if e.recycled else ""
    return f"{e.model}: standby worker pid {e.pid}{how} ready for the next reload"


def _phase_end(e: ev.PhaseEnd) -> str:
    # Its first line only: a failure's detail is the error the reload's FAILED line prints
    # whole next (a size mismatch runs to a line per tensor, and read twice over).
    first, _, more = (e.detail or "").partition("\n")
    extra = f" - {first}{' …' if more.strip() else ''}" if first else ""
    status = "ok" if e.ok else "FAILED"
    if e.skipped:
        status = "skipped"
    return f"{e.model}:   {e.phase:<7} {e.duration_s * 1000:8.1f} ms  {status}{extra}"


def _reload_done(e: ev.ReloadDone) -> str:
    if e.unchanged:
        return f"{e.model}: {e.unchanged}"
    what = "reload"
    if e.trigger == "rollback":  # a kept version served again: which one
        what = f"rollback to v{e.rollback_of}" if e.rollback_of else "rollback"
    return (
        f"{e.model}: {what} -> v{e.version} ok in {e.total_s:.2f} s "
        f"({e.policy}, {e.strategy}){_weights(e.digest)}"
        + (f"; inputs changed: {e.inputs_changed}" if e.inputs_changed else "")
        + (f"; {compile_text(e.compile)}" if e.compile else "")
        + (f"; {golden_summary(e.golden)}" if e.golden else "")
    )


def _eval_done(e: ev.EvalDone) -> str:
    if e.error:
        return f"{e.model}: eval of v{e.version} FAILED: {e.error} (v{e.version} serves on)"
    shown = ", ".join(f"{k} {v:.4g}" for k, v in (e.figures or {}).items()) or "no figures"
    took = f" in {e.eval_s:.2f} s" if e.eval_s is not None else ""
    return f"{e.model}: eval v{e.version}: {shown}{took}"


def _watch_resumed(e: ev.WatchResumed) -> str:
    n = e.waiting
    return "watcher resumed" + (f": reloading {_plural(n)} made while paused" if n else "")


def _rewarm_done(e: ev.RewarmDone) -> str:
    passes = ", ".join(f"{p:.1f}" for p in e.passes_ms[:5])
    return f"{e.model}: warm-up re-run in {e.warm_s * 1000:.0f} ms ({passes} ms)"


#: Event class -> its plain-mode line. A kind of engine/event_kinds.py is here or in
#: SILENT_KINDS (tests/test_printer.py).
FORMATTERS: dict[type[ev.BaseEvent], Formatter] = {
    # A model's worker
    ev.Ready: _ready,
    ev.ModelNote: lambda e: f"{e.model}: note: {e.message}",
    ev.StartFailed: lambda e: _with_traceback(
        f"{e.model}: failed to start in {e.phase or 'start'}: {e.error}", e.traceback
    ),
    ev.WorkerDied: lambda e: f"{e.model}: worker pid {e.pid} died ({e.reason}); restarting",
    ev.StandbyReady: _standby_ready,
    ev.SnapshotRewritten: lambda e: f"{e.model}: warning: {e.message}",
    ev.WeightsOverride: lambda e: f"{e.model}: warning: {e.message}",
    ev.CheckpointWait: lambda e: f"{e.model}: {e.message}",
    ev.LockWait: lambda e: f"{e.model}: {e.message}",
    ev.RecycleDisabled: lambda e: (
        f"{e.model}: {e.reason}; from now on each standby is a fresh process"
    ),
    ev.StandbyFailed: lambda e: (
        f"{e.model}: standby worker did not start ({e.error}); reloads spawn one"
    ),
    ev.WorkerRestarted: lambda e: f"{e.model}: worker restarted (pid {e.pid}, v{e.version})",
    ev.RestartFailed: lambda e: (
        f"{e.model}: restart attempt {e.attempt} failed in {e.phase}: {e.error}"
    ),
    ev.Wedged: lambda e: f"{e.model}: WEDGED in {e.phase}: {e.detail}; killing the worker",
    ev.RewarmDone: _rewarm_done,
    ev.CpusFailed: lambda e: f"{e.model}: warning: worker pid {e.pid}: {e.detail}",
    ev.GpuReset: lambda e: f"{e.model}: GPU reset {'done' if e.ok else 'not done'}: {e.message}",
    # Reloads
    ev.ReloadRequested: lambda e: (
        f"{e.model}: reload requested by {e.trigger}" + (f" ({e.detail})" if e.detail else "")
    ),
    ev.Policy: lambda e: f"{e.model}: policy {e.policy} ({e.reason})",
    ev.PhaseEnd: _phase_end,
    ev.ReloadDone: _reload_done,
    ev.EvalDone: _eval_done,
    ev.ReloadFailed: lambda e: _with_traceback(
        f"{e.model}: reload FAILED in {e.phase}: {e.error} - v{e.version} keeps serving",
        e.traceback,
    ),
    # The watcher
    ev.WatchError: lambda e: f"watcher: {e.error}",
    ev.FileUnused: lambda e: (
        f"watcher: {e.path} is not used by any model: nothing reloads (list it in a "
        "model's `watch` if its build reads it)"
    ),
    ev.WatchPaused: lambda e: "watcher paused: edits are not reloaded until it resumes",
    ev.WatchWaiting: lambda e: f"watcher paused: {_plural(e.waiting)} waiting (applied on resume)",
    ev.WatchResumed: _watch_resumed,
    ev.Watching: lambda e: f"watching {', '.join(e.paths)} (quiet {e.quiet_ms} ms)",
    # Session, config, front ends
    ev.ConfigError: lambda e: f"config error: {e.error}",
    ev.ConfigChanged: lambda e: e.detail,
    ev.HttpStarted: lambda e: f"http: listening on {e.url}\nhttp: metrics on {e.metrics_url}",
    ev.Cpus: lambda e: f"cpus: {e.detail}",
    ev.EventsFileError: lambda e: f"warning: {e.message}",
    ev.EventsFileResumed: lambda e: e.message,
    # The GPU
    ev.GpuUnavailable: lambda e: f"no GPU data: {e.reason}",
    ev.XidSources: lambda e: "Xid sources: " + describe_xid_sources(e.sources),
    ev.Xid: lambda e: f"Xid {e.xid} ({e.name}, {e.severity}) on {e.pci}: {e.action}",
}

#: Event classes plain mode does not print (tests/test_printer.py: every kind is here or
#: above).
SILENT_KINDS: frozenset[type[ev.BaseEvent]] = frozenset(
    {
        # Too chatty for a log: each state change, phase start, debounce window.
        ev.State,
        ev.PhaseStart,
        ev.ChangeDetected,
        ev.RewarmStarted,
        # Said by another line: `ready`, `watching` or `http_started`; the command's exit;
        # the dashboard's own (it publishes `session_lost`).
        ev.SessionStarted,
        ev.WorkerStarted,
        ev.SessionStopping,
        ev.SessionStopped,
        ev.SessionLost,
        # Trouble that has never had a line of its own (a restart, or the reload's outcome,
        # follows the first two; nothing says the third): candidates for one.
        ev.WorkerLost,
        ev.RestoreFailed,
        ev.SnapshotSkipped,
    }
)


def format_event(e: ev.BaseEvent) -> str | None:
    """The line to print for an event, or None for events too chatty for plain mode."""
    formatter = FORMATTERS.get(type(e))
    return None if formatter is None else formatter(e)


class PlainPrinter:
    def __init__(
        self, out: TextIO | None = None, timestamps: bool = True, colour: bool | None = None
    ) -> None:
        self.out = out or sys.stdout
        self.timestamps = timestamps
        #: None: colour when `out` is a terminal and NO_COLOR is unset.
        self.colour = wants_colour(self.out) if colour is None else colour

    def __call__(self, event: ev.BaseEvent) -> None:
        line = format_event(event)
        if line is None:
            return
        if self.colour:
            head, _, rest = line.partition("\n")
            line = paint(head, EVENT_STYLES.get(type(event)), True)
            if rest:
                line += "\n" + paint(rest, "dim", True)
        if self.timestamps:
            line = f"{time.strftime('%H:%M:%S', time.localtime(event.ts))} {line}"
        print(line, file=self.out, flush=True)

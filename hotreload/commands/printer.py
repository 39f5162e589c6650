"""Plain mode: one readable line per event (serve, `watch --no-tui`, logs, CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from hotreload.colour import paint, wants_colour
from hotreload.engine.telemetry import describe_xid_sources

#: The colour of an event's first line in a terminal (a traceback below it is dimmed).
EVENT_STYLES = {
    "ready": "green",
    "reload_done": "green",
    "worker_restarted": "green",
    "start_failed": "bold red",
    "reload_failed": "bold red",
    "restart_failed": "red",
    "wedged": "bold red",
    "worker_died": "red",
    "config_error": "red",
    "watch_error": "red",
    "snapshot_rewritten": "yellow",
    "cpus_failed": "yellow",
    "watch_paused": "yellow",
    "watch_waiting": "yellow",
}


Formatter = Callable[[dict[str, Any]], str]


def _m(e: dict[str, Any]) -> str:
    return e.get("model", "")


def _plural(n: int) -> str:
    return f"{n} change{'s' if n != 1 else ''}"


def _with_traceback(text: str, e: dict[str, Any]) -> str:
    return text + ("\n" + e["traceback"].rstrip() if e.get("traceback") else "")


def _ready(e: dict[str, Any]) -> str:
    return (
        f"{_m(e)}: v{e['version']} ready on {e.get('device')} "
        f"(load {e.get('load_s', 0):.2f} s, warm-up {e.get('warm_s', 0):.2f} s, "
        f"worker pid {e.get('pid')})"
        + (f"; inputs {e['inputs']}" if e.get("inputs") else "")
        + _weights(e)
    )


def _weights(e: dict[str, Any]) -> str:
    """`; weights sha256:d513bd5d`: which weights serve (the digest's first 8 hex digits;
    the whole one is in `hotreload status` and each reply)."""
    digest = e.get("digest")
    return f"; weights {digest[:15]}" if isinstance(digest, str) else ""


def _standby_ready(e: dict[str, Any]) -> str:
    how = f" (kept after {e.get('after') or 'serving'})" if e.get("recycled") else ""
    return f"{_m(e)}: standby worker pid {e.get('pid')}{how} ready for the next reload"


def _phase_end(e: dict[str, Any]) -> str:
    # Its first line only: a failure's detail is the error the reload's FAILED line prints
    # whole next (a size mismatch runs to a line per tensor, and read twice over).
    first, _, more = str(e.get("detail") or "").partition("\n")
    extra = f" - {first}{' …' if more.strip() else ''}" if first else ""
    status = "ok" if e.get("ok", True) else "FAILED"
    if e.get("skipped"):
        status = "skipped"
    return (
        f"{_m(e)}:   {e.get('phase'):<7} {e.get('duration_s', 0) * 1000:8.1f} ms  {status}{extra}"
    )


def _watch_resumed(e: dict[str, Any]) -> str:
    n = e.get("waiting", 0)
    return "watcher resumed" + (f": reloading {_plural(n)} made while paused" if n else "")


def _rewarm_done(e: dict[str, Any]) -> str:
    passes = ", ".join(f"{p:.1f}" for p in e.get("passes_ms", [])[:5])
    return f"{_m(e)}: warm-up re-run in {e.get('warm_s', 0) * 1000:.0f} ms ({passes} ms)"


#: kind -> its plain-mode line. A kind of engine/event_kinds.py is here or in SILENT_KINDS
#: (tests/test_printer.py).
FORMATTERS: dict[str, Formatter] = {
    # A model's worker
    "ready": _ready,
    "model_note": lambda e: f"{_m(e)}: note: {e.get('message')}",
    "start_failed": lambda e: _with_traceback(
        f"{_m(e)}: failed to start in {e.get('phase') or 'start'}: {e.get('error')}", e
    ),
    "worker_died": lambda e: (
        f"{_m(e)}: worker pid {e.get('pid')} died ({e.get('reason')}); restarting"
    ),
    "standby_ready": _standby_ready,
    "snapshot_rewritten": lambda e: f"{_m(e)}: warning: {e.get('message')}",
    "weights_override": lambda e: f"{_m(e)}: warning: {e.get('message')}",
    "checkpoint_wait": lambda e: f"{_m(e)}: {e.get('message')}",
    "lock_wait": lambda e: f"{_m(e)}: {e.get('message')}",
    "recycle_disabled": lambda e: (
        f"{_m(e)}: {e.get('reason')}; from now on each standby is a fresh process"
    ),
    "standby_failed": lambda e: (
        f"{_m(e)}: standby worker did not start ({e.get('error')}); reloads spawn one"
    ),
    "worker_restarted": lambda e: (
        f"{_m(e)}: worker restarted (pid {e.get('pid')}, v{e.get('version')})"
    ),
    "restart_failed": lambda e: (
        f"{_m(e)}: restart attempt {e.get('attempt')} failed in {e.get('phase')}: {e.get('error')}"
    ),
    "wedged": lambda e: (
        f"{_m(e)}: WEDGED in {e.get('phase')}: {e.get('detail')}; killing the worker"
    ),
    "rewarm_done": _rewarm_done,
    "cpus_failed": lambda e: f"{_m(e)}: warning: worker pid {e.get('pid')}: {e.get('detail')}",
    "gpu_reset": lambda e: (
        f"{_m(e)}: GPU reset {'done' if e.get('ok') else 'not done'}: {e.get('message')}"
    ),
    # Reloads
    "reload_requested": lambda e: (
        f"{_m(e)}: reload requested by {e.get('trigger')}"
        + (f" ({e['detail']})" if e.get("detail") else "")
    ),
    "policy": lambda e: f"{_m(e)}: policy {e.get('policy')} ({e.get('reason')})",
    "phase_end": _phase_end,
    "reload_done": lambda e: (
        f"{_m(e)}: {e['unchanged']}"
        if e.get("unchanged")
        else f"{_m(e)}: reload -> v{e.get('version')} ok in {e.get('total_s', 0):.2f} s "
        f"({e.get('policy')}, {e.get('strategy')}){_weights(e)}"
        + (f"; inputs changed: {e['inputs_changed']}" if e.get("inputs_changed") else "")
    ),
    "reload_failed": lambda e: _with_traceback(
        f"{_m(e)}: reload FAILED in {e.get('phase')}: {e.get('error')} "
        f"- v{e.get('version')} keeps serving",
        e,
    ),
    # The watcher
    "watch_error": lambda e: f"watcher: {e.get('error')}",
    "file_unused": lambda e: (
        f"watcher: {e.get('path')} is not used by any model: nothing reloads (list it in a "
        "model's `watch` if its build reads it)"
    ),
    "watch_paused": lambda e: "watcher paused: edits are not reloaded until it resumes",
    "watch_waiting": lambda e: (
        f"watcher paused: {_plural(e.get('waiting', 0))} waiting (applied on resume)"
    ),
    "watch_resumed": _watch_resumed,
    "watching": lambda e: (
        f"watching {', '.join(e.get('paths', []))} (quiet {e.get('quiet_ms')} ms)"
    ),
    # Session, config, front ends
    "config_error": lambda e: f"config error: {e.get('error')}",
    "config_changed": lambda e: str(e.get("detail")),
    "http_started": lambda e: (
        f"http: listening on {e.get('url')}\nhttp: metrics on {e.get('metrics_url')}"
    ),
    "cpus": lambda e: f"cpus: {e.get('detail')}",
    "events_file_error": lambda e: "warning: " + str(e.get("message")),
    "events_file_resumed": lambda e: str(e.get("message")),
    # The GPU
    "gpu_unavailable": lambda e: f"no GPU data: {e.get('reason')}",
    "xid_sources": lambda e: "Xid sources: " + describe_xid_sources(e.get("sources", [])),
    "xid": lambda e: (
        f"Xid {e.get('xid')} ({e.get('name')}, {e.get('severity')}) on {e.get('pci')}: "
        f"{e.get('action')}"
    ),
}

#: Kinds plain mode does not print (tests/test_printer.py: every kind is here or above).
SILENT_KINDS = frozenset(
    {
        # Too chatty for a log: each state change, phase start, debounce window.
        "state",
        "phase_start",
        "change_detected",
        "rewarm_started",
        # Said by another line: `ready`, `watching` or `http_started`; the command's exit;
        # the dashboard's own (it publishes `session_lost`).
        "session_started",
        "worker_started",
        "session_stopping",
        "session_stopped",
        "session_lost",
        # Trouble that has never had a line of its own (a restart, or the reload's outcome,
        # follows the first two; nothing says the third): candidates for one.
        "worker_lost",
        "restore_failed",
        "snapshot_skipped",
    }
)


def format_event(e: dict[str, Any]) -> str | None:
    """The line to print for an event, or None for events too chatty for plain mode."""
    formatter = FORMATTERS.get(str(e.get("kind")))
    return None if formatter is None else formatter(e)


class PlainPrinter:
    def __init__(
        self, out: TextIO | None = None, timestamps: bool = True, colour: bool | None = None
    ) -> None:
        self.out = out or sys.stdout
        self.timestamps = timestamps
        #: None: colour when `out` is a terminal and NO_COLOR is unset.
        self.colour = wants_colour(self.out) if colour is None else colour

    def __call__(self, event: dict[str, Any]) -> None:
        line = format_event(event)
        if line is None:
            return
        if self.colour:
            head, _, rest = line.partition("\n")
            line = paint(head, EVENT_STYLES.get(str(event.get("kind"))), True)
            if rest:
                line += "\n" + paint(rest, "dim", True)
        if self.timestamps:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.get("ts", time.time())))
            line = f"{stamp} {line}"
        print(line, file=self.out, flush=True)

"""Plain mode: one readable line per event (serve, `watch --no-tui`, logs, CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from hotreload.colour import paint, wants_colour

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
    "reload_skipped": "dim",
}


def describe_xid_sources(
    sources: Iterable[dict[str, Any]], clean: Callable[[str], str] = str
) -> str:
    """`nvml off (why); kmsg on`: each Xid source, and why an inactive one is off."""
    return "; ".join(
        f"{s['name']} {'on' if s['active'] else 'off'}"
        + ("" if s["active"] else f" ({clean(str(s['reason']))})")
        for s in sources
    )


def format_event(e: dict[str, Any]) -> str | None:
    """The line to print for an event, or None for events too chatty for plain mode."""
    kind = e.get("kind")
    m = e.get("model", "")
    if kind == "ready":
        return (
            f"{m}: v{e['version']} ready on {e.get('device')} "
            f"(load {e.get('load_s', 0):.2f} s, warm-up {e.get('warm_s', 0):.2f} s, "
            f"worker pid {e.get('pid')})" + (f"; inputs {e['inputs']}" if e.get("inputs") else "")
        )
    if kind == "model_note":
        return f"{m}: note: {e.get('message')}"
    if kind == "start_failed":
        text = f"{m}: failed to start in {e.get('phase') or 'start'}: {e.get('error')}"
        if e.get("traceback"):
            text += "\n" + e["traceback"].rstrip()
        return text
    if kind == "worker_died":
        return f"{m}: worker pid {e.get('pid')} died ({e.get('reason')}); restarting"
    if kind == "standby_ready":
        how = f" (kept after {e.get('after') or 'serving'})" if e.get("recycled") else ""
        return f"{m}: standby worker pid {e.get('pid')}{how} ready for the next reload"
    if kind in ("snapshot_rewritten", "weights_override"):
        return f"{m}: warning: {e.get('message')}"
    if kind == "recycle_disabled":
        return f"{m}: {e.get('reason')}; from now on each standby is a fresh process"
    if kind == "standby_failed":
        return f"{m}: standby worker did not start ({e.get('error')}); reloads spawn one"
    if kind == "worker_restarted":
        return f"{m}: worker restarted (pid {e.get('pid')}, v{e.get('version')})"
    if kind == "restart_failed":
        return (
            f"{m}: restart attempt {e.get('attempt')} failed in {e.get('phase')}: {e.get('error')}"
        )
    if kind == "wedged":
        return f"{m}: WEDGED in {e.get('phase')}: {e.get('detail')}; killing the worker"
    if kind == "reload_requested":
        return f"{m}: reload requested by {e.get('trigger')}" + (
            f" ({e['detail']})" if e.get("detail") else ""
        )
    if kind == "policy":
        return f"{m}: policy {e.get('policy')} ({e.get('reason')})"
    if kind == "phase_end":
        extra = f" - {e['detail']}" if e.get("detail") else ""
        status = "ok" if e.get("ok", True) else "FAILED"
        if e.get("skipped"):
            status = "skipped"
        return (
            f"{m}:   {e.get('phase'):<7} {e.get('duration_s', 0) * 1000:8.1f} ms  {status}{extra}"
        )
    if kind == "reload_done":
        return (
            f"{m}: reload -> v{e.get('version')} ok in {e.get('total_s', 0):.2f} s "
            f"({e.get('policy')}, {e.get('strategy')})"
        )
    if kind == "reload_failed":
        text = (
            f"{m}: reload FAILED in {e.get('phase')}: {e.get('error')} "
            f"- v{e.get('version')} keeps serving"
        )
        if e.get("traceback"):
            text += "\n" + e["traceback"].rstrip()
        return text
    if kind == "reload_skipped":
        return f"{m}: no reload: {e.get('reason')}"
    if kind == "watch_error":
        return f"watcher: {e.get('error')}"
    if kind == "watch_paused":
        return "watcher paused: edits are not reloaded until it resumes"
    if kind == "watch_waiting":
        n = e.get("waiting", 0)
        return f"watcher paused: {n} change{'s' if n != 1 else ''} waiting (applied on resume)"
    if kind == "watch_resumed":
        n = e.get("waiting", 0)
        return "watcher resumed" + (
            f": reloading {n} change{'s' if n != 1 else ''} made while paused" if n else ""
        )
    if kind == "watching":
        return f"watching {', '.join(e.get('paths', []))} (quiet {e.get('quiet_ms')} ms)"
    if kind == "rewarm_done":
        passes = ", ".join(f"{p:.1f}" for p in e.get("passes_ms", [])[:5])
        return f"{m}: warm-up re-run in {e.get('warm_s', 0) * 1000:.0f} ms ({passes} ms)"
    if kind == "config_error":
        return f"config error: {e.get('error')}"
    if kind == "config_changed":
        return str(e.get("detail"))
    if kind == "http_started":
        return f"http: listening on {e.get('url')}\nhttp: metrics on {e.get('metrics_url')}"
    if kind == "cpus":
        return f"cpus: {e.get('detail')}"
    if kind == "cpus_failed":
        return f"{m}: warning: worker pid {e.get('pid')}: {e.get('detail')}"
    if kind in ("events_file_error", "events_file_resumed"):
        return ("warning: " if kind == "events_file_error" else "") + str(e.get("message"))
    if kind == "gpu_unavailable":
        return f"no GPU data: {e.get('reason')}"
    if kind == "gpu_reset":
        return f"{m}: GPU reset {'done' if e.get('ok') else 'not done'}: {e.get('message')}"
    if kind == "xid_sources":
        return "Xid sources: " + describe_xid_sources(e.get("sources", []))
    if kind == "xid":
        return (
            f"Xid {e.get('xid')} ({e.get('name')}, {e.get('severity')}) on {e.get('pci')}: "
            f"{e.get('action')}"
        )
    return None


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

"""Pure formatting: samples and state in, rich `Text` and table rows out (no widgets)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text

from hotreload.engine.cpus import format_cpus
from hotreload.engine.model import ReloadOutcome
from hotreload.engine.telemetry import describe_xid_sources
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.xid_events import XidEvent
from hotreload.tui.state import DashboardState, LiveReload
from hotreload.tui.traceback_view import PACKAGE_DIR, is_hotreload_frame, user_traceback

__all__ = ["PACKAGE_DIR", "is_hotreload_frame", "user_traceback"]

MIB = 2**20
GIB = 2**30
BLOCKS = "▁▂▃▄▅▆▇█"
STATE_STYLES = {
    "serving": "bold green",
    "starting": "yellow",
    "loading": "yellow",
    "warming": "yellow",
    "reloading": "yellow",
    "restarting": "yellow",
    "draining": "cyan",
    "failed": "bold red",
    "wedged": "bold white on red",
    "stopped": "dim",
    "unloaded": "dim",
}
#: Xid severities that get a red row and a notification.
CRITICAL_SEVERITIES = frozenset({"hardware", "driver"})


def is_critical(x: XidEvent) -> bool:
    return x.severity in CRITICAL_SEVERITIES or x.needs_power_cycle


def plain_reason(reason: str) -> str:
    """A reason without its parenthesised detail (a library file name says little)."""
    return re.sub(r" *[(][^)]*[)]", "", reason)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def sparkline(values: Sequence[float], width: int) -> str:
    """`values` squeezed into `width` cells (max per bucket, so a spike is never lost)."""
    if width <= 0 or not values:
        return ""
    step = max(1, math.ceil(len(values) / width))
    buckets = [max(values[i : i + step]) for i in range(0, len(values), step)]
    top = max(buckets)
    if top <= 0:
        return BLOCKS[0] * len(buckets)
    return "".join(BLOCKS[min(7, int(v / top * 7.999))] for v in buckets)


def bar(fraction: float, width: int) -> Text:
    width = max(width, 1)
    filled = round(max(0.0, min(1.0, fraction)) * width)
    style = "green" if fraction < 0.75 else "yellow" if fraction < 0.9 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def phases_text(phases: dict[str, float]) -> str:
    return " ".join(f"{p} {s * 1000:.0f}" for p, s in phases.items())


def trigger_text(o: ReloadOutcome | LiveReload) -> str:
    detail = o.detail if isinstance(o.detail, str) else ", ".join(o.detail or [])
    return f"{o.trigger} {detail}".strip()


# ---------------------------------------------------------------------- models


def reach_text(sample: Any, model: str | None, width: int) -> str:
    """Under the models table: how a client reaches the selected model, the longest form
    that fits `width` (the HTTP routes, else the socket and how to add HTTP)."""
    if sample is None:
        return ""
    url, name = sample.http_url, model or "NAME"
    if url:
        infer = f"{url}/v2/models/{name}/infer"
        generator = name in sample.generators
        forms = [
            f"KServe v2 POST {infer}" + (f" · completions base URL {url}/v1" if generator else ""),
            f"HTTP {infer}" + (f" · {url}/v1" if generator else ""),
            f"HTTP {url}",
        ]
    elif sample.socket:
        forms = [
            f"socket {sample.socket} · no HTTP: --http 127.0.0.1:8000 adds KServe v2",
            f"socket {sample.socket} · no HTTP (--http HOST:PORT)",
            f"socket {sample.socket}",
        ]
    else:
        return ""
    for form in forms:
        if len(form) <= width:
            return form
    return forms[-1]


def last_reload(outcomes: Sequence[ReloadOutcome], hms: Callable[[float], str]) -> Text:
    if not outcomes:
        return Text("-", "dim")
    o = outcomes[-1]
    if o.ok:
        return Text(f"{hms(o.started_at)} ok {o.total_s:.2f} s", "green")
    return Text(f"{hms(o.started_at)} FAILED in {o.phase or '?'}", "bold red")


#: States a model passes through: the Models panel shows how long it has been in one.
TRANSIENT_STATES = frozenset({"starting", "loading", "warming", "restarting"})


def elapsed_text(since: float | None, now: float | None) -> str:
    """` 12 s`: how long a waiting state has lasted, so a long load never looks stuck."""
    if since is None or now is None or not since:
        return ""
    return f" {max(0.0, now - since):.0f} s"


def version_text(version: int, digest: Any, pushes: int) -> Text:
    """`v3 d513bd5d +2`: the version, the first 8 hex digits of its weights' digest (the
    whole one is in `hotreload status`), and how many trainer pushes lie over the files'."""
    if not version:
        return Text("-")
    text = Text(f"v{version}")
    if isinstance(digest, str) and ":" in digest:
        text.append(f" {digest.split(':', 1)[1][:8]}", "dim")
    if pushes:
        text.append(f" +{pushes}", "cyan")
    return text


def model_rows(
    state: DashboardState, hms: Callable[[float], str], now: float | None = None
) -> tuple[tuple[Any, ...], ...]:
    sample = state.sample
    if sample is None:
        return ()
    rows = []
    for m in sample.models:
        name = m["name"]
        st = str(m.get("state"))
        label = Text(st, STATE_STYLES.get(st, ""))
        if st in TRANSIENT_STATES:
            label.append(elapsed_text(state.state_since.get(name), now), "yellow")
        phase = sample.phases.get(name)
        if phase and st != "loading":
            label.append(f" ({phase})", "yellow")
        version = int(m.get("version") or 0)
        mine = [o for o in sample.reloads if o.model == name]
        rows.append(
            (
                name,
                version_text(version, m.get("digest"), int(m.get("pushes") or 0)),
                label,
                f"{m.get('policy')}/{m.get('strategy')}",
                str(m.get("device") or "-"),
                last_reload(mine, hms),
            )
        )
    return tuple(rows)


# ---------------------------------------------------------------------- queue, latency


def queue_text(m: dict[str, Any] | None, history: Sequence[int], width: int) -> Text:
    if m is None:
        return Text("no model", "dim")
    req = m.get("requests") or {}
    rejected, timed_out = req.get("rejected", 0), req.get("timed_out", 0)
    depth = Text.assemble("queued ", (f"{m.get('queue_depth', 0)}", "bold"))
    depth.append(f" / {m.get('queue_limit', 0)}")
    inflight = f"in flight {m.get('inflight', 0)}"
    rej = Text.assemble("rejected ", (str(rejected), "bold red" if rejected else ""))
    tmo = Text.assemble("timed out ", (str(timed_out), "bold red" if timed_out else ""))
    spark = Text(sparkline(history, width), "cyan")
    wide = depth + Text(f"  {inflight}")
    if len(wide) <= width:  # room for two figures a line
        lines = [
            wide,
            spark,
            rej + Text("  ") + tmo,
            Text(f"ok {req.get('ok', 0):,}  failed {req.get('failed', 0)}", "dim"),
        ]
    else:
        lines = [depth, spark, rej, tmo, Text(inflight)]
    return Text("\n").join(lines)


def latency_text(m: dict[str, Any] | None, history: Sequence[float], width: int) -> Text:
    if m is None:
        return Text("no model", "dim")
    lat = m.get("latency") or {}
    if not lat.get("count"):
        return Text("no requests in the last minute (l starts a demo load)", "dim")
    p50 = Text.assemble("p50 ", (f"{lat['p50_ms']:.2f}", "bold"))
    p95 = Text.assemble("p95 ", (f"{lat['p95_ms']:.2f}", "bold"))
    p99 = Text.assemble("p99 ", (f"{lat['p99_ms']:.2f}", "bold yellow"))
    spark = Text(sparkline(history, width), "yellow")
    count = f"{lat['count']:,} req in 60 s"
    wide = p50 + Text("  ") + p95 + Text("  ") + p99
    gen = m.get("text")  # a text generator's completions (engine/text_stats.py)
    caption = Text("p99 trend, last 2 min", "dim")
    if gen and gen.get("completions"):
        caption = Text.assemble(
            (f"{gen['tokens_per_s']:,.0f}", "bold"),
            " tok/s  first token ",
            (f"{gen['ttft_p50_ms']:.1f}", "bold"),
            " ms",
        )
    if len(wide) <= width:
        lines = [
            wide,
            spark,
            caption,
            Text(f"{lat['count']:,} req/60 s, max {lat.get('max_ms', 0):.2f}", "dim"),
        ]
    else:
        lines = [p50 + Text(" ") + p95, p99, spark, Text(count, "dim")]
    return Text("\n").join(lines)


# ---------------------------------------------------------------------- memory


def _gpu_lines(gpu: GpuSnapshot, width: int) -> list[Text]:
    lines = []
    for d in gpu.devices:
        if d.problem:
            lines.append(Text(f"GPU{d.index}: {d.problem}", "red"))
            continue
        figures = f" {d.memory_used / GIB:.1f}/{d.memory_total / GIB:.0f} GiB"
        head = f"GPU{d.index} "
        line = Text(head)
        line.append_text(bar(d.memory_used / max(d.memory_total, 1), width - len(head + figures)))
        line.append(figures)
        lines.append(line)
        own = [p for p in d.processes if p.is_hotreload_worker]
        own_bytes = sum(p.used_memory_bytes or 0 for p in own)
        share = own_bytes / d.memory_used if d.memory_used else 0.0
        lines.append(
            Text(f" hotreload {own_bytes / GIB:.2f} GiB ({share:.0%}, {len(own)} proc)", "dim")
        )
    return lines


def memory_text(state: DashboardState, selected: str | None, width: int) -> Text:
    sample = state.sample
    if sample is None:
        return Text("waiting for the first reading", "dim")
    lines: list[Text] = []
    gpu = sample.gpu
    if gpu is not None and gpu.available:
        lines += _gpu_lines(gpu, width)
    else:
        why = gpu.reason if gpu is not None and gpu.reason else "no reading yet"
        # The library file name in parentheses says little to a person: keep the why.
        lines.append(Text(f"no GPU data: {plain_reason(why)}", "yellow"))
    # The selected model first: on a short screen its lines are the ones that fit.
    for m in sorted(sample.models, key=lambda m: m["name"] != selected):
        alloc = (m.get("worker") or {}).get("allocator")
        mark = "▸" if m["name"] == selected and len(sample.models) > 1 else ""
        line = Text(f"{mark}{m['name']} ", "bold", no_wrap=True, overflow="ellipsis")
        if alloc:
            line.append(
                f"alloc {mib(alloc.get('allocated_bytes'))} res {mib(alloc.get('reserved_bytes'))}"
                " MiB"
            )
        else:
            rss = (m.get("worker") or {}).get("rss_bytes")
            line.append(f"pid {m.get('pid') or '-'} RSS {mib(rss)} MiB")
        cpus = m.get("cpus")
        if cpus:
            line.append(f" on CPU {format_cpus(cpus['serving'])}", "dim")
        lines.append(line)
        if not cpus and m.get("cpus_unpinned_short"):
            lines.append(
                Text(
                    f" CPUs not pinned: {m['cpus_unpinned_short']}",
                    "dim",
                    no_wrap=True,
                    overflow="ellipsis",
                )
            )
        grown = state.growth(m)
        if grown is not None:
            delta, base = grown
            style = "bold red" if delta > 64 * MIB else "yellow" if delta > 8 * MIB else "dim"
            what = "alloc" if base.kind == "allocated" else "RSS"
            lines.append(
                Text(f" {what} {delta / MIB:+.1f} MiB since v{base.version}", style, no_wrap=True)
            )
        standby = m.get("standby")
        if standby:
            lines.append(
                Text(
                    f" standby pid {standby.get('pid')} RSS {mib(standby.get('rss_bytes'))} MiB",
                    "dim",
                    no_wrap=True,
                    overflow="ellipsis",
                )
            )
    return Text("\n").join(lines)


# ---------------------------------------------------------------------- reloads


def reload_rows(
    state: DashboardState, hms: Callable[[float], str], now: float | None = None
) -> tuple[tuple[Any, ...], ...]:
    """Newest first; reloads running now on top, the running phase's time ticking."""
    sample = state.sample
    rows: list[tuple[Any, ...]] = []
    for live in sorted(state.live.values(), key=lambda r: -r.started_at):
        running = f"running {live.phase or ''}".strip()
        rows.append(
            (
                hms(live.started_at),
                live.model,
                Text(
                    running + elapsed_text(live.phase_started_at or live.started_at, now) + "…",
                    "bold yellow",
                ),
                "",
                trigger_text(live),
                "",
                phases_text(live.phases),
            )
        )
    for o in reversed(sample.reloads if sample else ()):
        outcome = (
            Text(f"v{o.version} {'unchanged' if o.unchanged else 'ok'}", "green")
            if o.ok
            else Text(f"FAILED {o.phase or ''}".strip(), "bold red")
        )
        rows.append(
            (
                hms(o.started_at),
                o.model,
                outcome,
                f"{o.total_s:.2f} s",
                trigger_text(o),
                f"{o.policy}/{o.strategy}".strip("/"),
                phases_text(o.phases),
            )
        )
    return tuple(rows)


def reload_detail(o: ReloadOutcome | None, start_error: dict[str, Any] | None) -> Text:
    if o is None:
        if start_error:
            t = Text(f"{start_error.get('model')} failed to start in ", "bold red")
            t.append(f"{start_error.get('phase') or 'start'}: {start_error.get('error')}")
            t.append("\nfix the file and save: the watcher tries again\n", "yellow")
            t.append(user_traceback(str(start_error.get("traceback") or "")), "dim")
            return t
        return Text("no reload yet: edit a watched file, or press r", "dim")
    phases = " · ".join(f"{p} {s * 1000:.1f}" for p, s in o.phases.items())
    if o.ok and o.unchanged:
        return Text(o.detail[-1] if o.detail else "unchanged: nothing to reload", "green")
    if o.ok:
        return Text.assemble((f"v{o.version} phases (ms): ", "bold green"), phases)
    t = Text()
    t.append(f"{o.model} FAILED in {o.phase}: ", "bold red")
    t.append(str(o.error))
    t.append(f" - v{o.version} keeps serving\n", "bold yellow")
    t.append(f"phases (ms): {phases}")
    if o.traceback:
        t.append("\n" + user_traceback(o.traceback), "dim")
    return t


# ---------------------------------------------------------------------- xids


def xid_rows(xids: Sequence[XidEvent], hms: Callable[[float], str]) -> tuple[tuple[Any, ...], ...]:
    rows = []
    for x in reversed(xids):
        style = "bold red" if is_critical(x) else ""
        gpu = str(x.device_index) if x.device_index is not None else (x.pci or "?")
        proc = f"{x.pid or '?'} {x.process or ''}".strip() if (x.pid or x.process) else "-"
        rows.append(
            tuple(
                Text(str(v), style)
                for v in (hms(x.received_at), gpu, x.xid, x.severity, proc, x.phase or "-", x.name)
            )
        )
    return tuple(rows)


def xid_sources_text(sources: Sequence[dict[str, Any]]) -> str:
    text = describe_xid_sources(sources, plain_reason)
    return "sources: " + text if text else "sources: starting"

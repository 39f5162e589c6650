"""Pure formatting: samples and state in, rich `Text` and table rows out (no widgets)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text

from hotreload.engine.compile_figures import compile_text
from hotreload.engine.cpus import format_cpus
from hotreload.engine.eval_text import eval_text
from hotreload.engine.event_kinds import StartFailed
from hotreload.engine.model import ReloadOutcome
from hotreload.engine.telemetry import describe_xid_sources
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.xid_events import XidEvent
from hotreload.tui.fit import first_fitting
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


def wrap_items(items: list[str], width: int, used: int = 0) -> str:
    """`items` joined by " · ", a line break before an item that would cross `width` (0: no
    limit): the terminal's wrap would part a phase from its figure ("sync" / "0.0")."""
    out = ""
    for i, item in enumerate(items):
        sep = " · " if i else ""
        if width and i and used + len(sep) + len(item) > width:
            out, used = out + "\n" + item, len(item)
        else:
            out, used = out + sep + item, used + len(sep) + len(item)
    return out


def trigger_text(o: ReloadOutcome | LiveReload) -> str:
    """`file model.py`: what set the reload off. An unchanged reload's last detail is the
    sentence saying so (engine/model/unchanged.py): the Outcome column and the line under
    the table say it, and here it would push the phases out of a 120-column table."""
    if isinstance(o.detail, str) or o.detail is None:
        detail = o.detail or ""
    else:
        files = o.detail[:-1] if isinstance(o, ReloadOutcome) and o.unchanged else o.detail
        detail = ", ".join(files)
    return f"{o.trigger} {detail}".strip()


def policy_text(o: ReloadOutcome, configured: str | None) -> str:
    """`auto→availability/inplace`: the policy a reload ran with, in the Models panel's
    words (`auto/inplace`) when the config left the choice to `auto`; `-` when nothing was
    built (an unchanged save)."""
    if not o.policy:
        return "-"
    chosen = o.policy  # a push loads beside the old version whatever the policy says
    if configured == "auto" and o.trigger != "push" and chosen in ("availability", "resource"):
        chosen = f"auto→{chosen}"
    return f"{chosen}/{o.strategy}".strip("/")


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


def last_reload(
    outcomes: Sequence[ReloadOutcome], hms: Callable[[float], str], *, times: bool = True
) -> Text:
    """`12:01:30 ok 0.16 s`, `unchanged` or `FAILED in load` (the Reloads table's words);
    without `times` when the row must be narrow (the time is in the Reloads table)."""
    if not outcomes:
        return Text("-", "dim")
    o = outcomes[-1]
    when = f"{hms(o.started_at)} " if times else ""
    if o.ok and o.unchanged:
        return Text(f"{when}unchanged", "green")
    if o.ok:
        return Text(f"{when}ok {o.total_s:.2f} s", "green")
    return Text(f"{when}FAILED in {o.phase or '?'}", "bold red")


#: States a model passes through: the Models panel shows how long it has been in one.
TRANSIENT_STATES = frozenset({"starting", "loading", "warming", "restarting"})


def elapsed_text(since: float | None, now: float | None) -> str:
    """` 12 s`: how long a waiting state has lasted, so a long load never looks stuck."""
    if since is None or now is None or not since:
        return ""
    return f" {max(0.0, now - since):.0f} s"


def version_text(version: int, digest: Any, pushes: int, *, digests: bool = True) -> Text:
    """`v3 d513bd5d +2 pushes`: the version, the first 8 hex digits of its weights' digest
    (the whole one is in `hotreload status`; left out where the row must be narrow), and
    how many trainer pushes lie over the files' weights."""
    if not version:
        return Text("-")
    text = Text(f"v{version}")
    if digests and isinstance(digest, str) and ":" in digest:
        text.append(f" {digest.split(':', 1)[1][:8]}", "dim")
    if pushes:
        text.append(f" +{pushes} push{'es' if pushes != 1 else ''}", "cyan")
    return text


def model_rows(
    state: DashboardState,
    hms: Callable[[float], str],
    now: float | None = None,
    *,
    digests: bool = True,
    times: bool = True,
) -> tuple[tuple[Any, ...], ...]:
    """One row per model; `digests` and `times` off make it narrower (fit.fit_model_rows)."""
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
                version_text(version, m.get("digest"), int(m.get("pushes") or 0), digests=digests),
                label,
                f"{m.get('policy')}/{m.get('strategy')}",
                str(m.get("device") or "-"),
                last_reload(mine, hms, times=times),
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


def ms_text(value: float) -> str:
    """A latency in ms to about three figures (1.21, 38.4, 227, 1,530): a narrow panel
    holds p50 and p95 on one line, and past 100 ms the hundredths are noise."""
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def latency_text(
    m: dict[str, Any] | None, history: Sequence[float], width: int, height: int = 0
) -> Text:
    """The percentiles, a text generator's tokens/s and time to first token, the p99
    sparkline and the count, as many as fit `height` lines (0: no limit), in that order of
    importance. No line is longer than `width`: a figure never wraps in two."""
    if m is None:
        return Text("no model", "dim")
    lat = m.get("latency") or {}
    if not lat.get("count"):
        return Text("no requests in the last minute (l starts a demo load)", "dim")
    p50, p95, p99 = (
        Text.assemble(f"p{q} ", (ms_text(lat[f"p{q}_ms"]), style))
        for q, style in ((50, "bold"), (95, "bold"), (99, "bold yellow"))
    )
    figures = first_fitting(
        [
            [Text("  ").join([p50, p95, p99])],
            [Text(" ").join([p50, p95, p99])],
            [p50 + Text(" ") + p95, p99],
            [p50, p95, p99],
        ],
        width,
    )
    gen = m.get("text")  # a text generator's completions (engine/text_stats.py)
    tokens: list[Text] = []
    if gen and gen.get("completions"):
        tps = (f"{gen['tokens_per_s']:,.0f}", "bold")
        ttft = (ms_text(gen["ttft_p50_ms"]), "bold")
        tokens = first_fitting(
            [
                [Text.assemble(tps, " tok/s  first token ", ttft, " ms")],
                [Text.assemble(tps, " tok/s"), Text.assemble("first token ", ttft, " ms")],
                [Text.assemble(tps, " tok/s"), Text.assemble("1st token ", ttft, " ms")],
            ],
            width,
        )
    spark = [Text(sparkline(history, width), "yellow")]
    count = first_fitting(
        [
            [Text(f"{lat['count']:,} req/60 s, max {ms_text(lat.get('max_ms', 0))}", "dim")],
            [Text(f"{lat['count']:,} req in 60 s", "dim")],
            [Text(f"{lat['count']:,} req/60 s", "dim")],
        ],
        width,
    )
    caption = [] if tokens else [Text("p99 trend, last 2 min", "dim")]
    # Kept in order of importance while lines are left; shown in reading order.
    parts = {
        "figures": figures, "tokens": tokens, "spark": spark, "count": count, "caption": caption
    }  # fmt: skip
    left = height if height > 0 else sum(len(v) for v in parts.values())
    kept: set[str] = set()
    for name, lines in parts.items():
        if len(lines) <= left:
            kept.add(name)
            left -= len(lines)
    order = ("figures", "spark", "caption", "tokens", "count")
    out = Text("\n").join(line for name in order if name in kept for line in parts[name])
    out.no_wrap, out.overflow = True, "ellipsis"
    return out


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


def compile_line(m: dict[str, Any]) -> str:
    """` compiled 13.21 s (3 compiles; cache 4 hit(s), 1 miss(es)), 0 requests compiled`
    for a compiled model (its serving version's warm phase, and requests that compiled on
    the serving path since its worker started); "" for an eager one."""
    figures = m.get("compile")
    if not figures:
        return ""
    text = " " + compile_text({**figures, "reasons": []})
    served = (m.get("worker") or {}).get("serving_compiles")
    if served is not None:
        text += f", {served} request{'s' * (served != 1)} compiled"
    return text


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
        if cpus:  # "on" goes where it would wrap the CPU list onto a line of its own
            where = format_cpus(cpus["serving"])
            fits = line.cell_len + len(where) + 8 <= width
            line.append(f" on CPU {where}" if fits else f" CPU {where}", "dim")
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
        compiled = compile_line(m)
        if compiled:
            lines.append(Text(compiled, "dim", no_wrap=True, overflow="ellipsis"))
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
                policy_text(o, (state.model(o.model) or {}).get("policy")),
                phases_text(o.phases),
            )
        )
    return tuple(rows)


def reload_detail(o: ReloadOutcome | None, start_error: StartFailed | None, width: int = 0) -> Text:
    if o is None:
        if start_error:
            t = Text(f"{start_error.model} failed to start in ", "bold red")
            t.append(f"{start_error.phase or 'start'}: {start_error.error}")
            t.append("\nfix the file and save: the watcher tries again\n", "yellow")
            t.append(user_traceback(start_error.traceback or ""), "dim")
            return t
        return Text("no reload yet: edit a watched file, or press r", "dim")
    items = [f"{p} {s * 1000:.1f}" for p, s in o.phases.items()]
    if o.ok and o.unchanged:
        return Text(o.detail[-1] if o.detail else "unchanged: nothing to reload", "green")
    if o.ok:
        lead = f"v{o.version} phases (ms): "
        done = Text.assemble((lead, "bold green"), wrap_items(items, width, len(lead)))
        if o.eval:  # the version's eval (engine/model/evals.py), once it ran
            failed = bool(o.eval.get("error"))
            done.append(f"\neval: {eval_text(o.eval)}", "bold red" if failed else "cyan")
        return done
    t = Text()
    t.append(f"{o.model} FAILED in {o.phase}: ", "bold red")
    t.append(str(o.error))
    t.append(f" - v{o.version} keeps serving\n", "bold yellow")
    t.append("phases (ms): " + wrap_items(items, width, len("phases (ms): ")))
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


def short_reason(reason: str) -> str:
    """A reason's first clause: `NVML library not found` of `NVML library not found: no
    NVIDIA driver installed`; a clause that starts with a path keeps what follows it
    (`/dev/kmsg: permission denied`)."""
    clause = plain_reason(reason).split("; ")[0]
    head, sep, _ = clause.partition(": ")
    return head if sep and " " in head else clause


def xid_sources_text(sources: Sequence[dict[str, Any]], width: int = 0) -> str:
    """`sources: nvml off (why); kmsg on`, the whys shortened, then left out, until the
    line fits `width` (0: no limit): an Xid source is never cut to its first letter."""
    if not sources:
        return "sources: starting"
    forms = [
        "sources: " + describe_xid_sources(sources, plain_reason),
        "sources: " + describe_xid_sources(sources, short_reason),
        "sources: " + ", ".join(f"{s['name']} {'on' if s['active'] else 'off'}" for s in sources),
    ]
    return next((f for f in forms if width <= 0 or len(f) <= width), forms[-1])

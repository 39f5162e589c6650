"""`hotreload status`: ask a running session for each model's state and figures."""

from __future__ import annotations

import json
import sys
from typing import Any

from hotreload.engine.cpus import format_cpus
from hotreload.engine.eval_text import eval_text
from hotreload.engine.golden_text import summary
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE
from hotreload.session_call import call_session


def _mib(n: Any) -> str:
    return f"{n / 2**20:.0f} MiB" if isinstance(n, (int, float)) else "-"


def _ms(latency: dict[str, Any], key: str) -> str:
    """A latency figure, or `-` for a window without requests (0.00 would read as fast)."""
    if not latency.get("count", 1):
        return f"{'-':>8}"
    return f"{latency[key]:>8.2f}"


def format_status(status: dict[str, Any]) -> str:
    lines = [
        f"session pid {status['pid']}, up {status['uptime_s']:.0f} s, socket {status['socket']}"
    ]
    header = (
        f"{'MODEL':<16} {'STATE':<10} {'VER':>4} {'DEVICE':<8} {'QUEUE':>9} {'INFL':>4} "
        f"{'P50 ms':>8} {'P95 ms':>8} {'P99 ms':>8} {'OK':>8} {'REJ':>5} {'T/O':>5} "
        f"{'FAIL':>5} {'RSS':>9}"
    )
    lines.append(header)
    for m in status["models"]:
        lat, req, worker = m["latency"], m["requests"], m.get("worker", {})
        mem = _mib(worker.get("rss_bytes"))
        alloc = worker.get("allocator")
        if alloc:
            mem += f" (torch {_mib(alloc['allocated_bytes'])})"
        lines.append(
            f"{m['name']:<16} {m['state']:<10} {m['version']:>4} {m['device']:<8} "
            f"{str(m['queue_depth']) + '/' + str(m['queue_limit']):>9} {m['inflight']:>4} "
            f"{_ms(lat, 'p50_ms')} {_ms(lat, 'p95_ms')} {_ms(lat, 'p99_ms')} "
            f"{req['ok']:>8} {req['rejected']:>5} {req['timed_out']:>5} {req['failed']:>5} {mem:>9}"
        )
        if m.get("digest"):
            pushed = m.get("pushes") or 0
            lines.append(
                f"  weights {m['digest']}"
                + (f" (the files' with {pushed} push(es) over them)" if pushed else "")
            )
        lines.extend(adapter_lines(m.get("adapters")))
        golden = m.get("golden")
        if golden:
            lines.append(f"  golden v{golden['from']} -> v{golden['to']}: {summary(golden)}")
        scored = m.get("eval")
        if scored:
            lines.append(f"  eval v{scored['version']}: {eval_text(scored)}")
        if len(m.get("kept_versions") or []) > 1:
            kept = ", ".join(f"v{v}" for v in m["kept_versions"])
            lines.append(f"  kept for rollback: {kept}")
        waiting = m.get("waiting_for_version")
        if waiting:
            lines.append(f"  {waiting} request(s) waiting for a later version (min_version)")
        cpus = m.get("cpus")
        if cpus:
            lines.append(
                f"  serving worker on CPU {format_cpus(cpus['serving'])}, the session and reloads "
                f"on CPU {format_cpus(cpus['rest'])}"
            )
        elif m.get("cpus_unpinned"):
            lines.append(f"  not pinned to CPUs of its own: {m['cpus_unpinned']}")
        standby = m.get("standby")
        if standby:
            lines.append(
                f"  standby worker pid {standby['pid']} (RSS {_mib(standby.get('rss_bytes'))}) "
                "ready for the next reload"
            )
        if m.get("last_error"):
            lines.append(f"  last error: {m['last_error']}")
    return "\n".join(lines)


def status_main(config: str | None, *, as_json: bool = False, model: str | None = None) -> int:
    status, code = call_session(config, lambda c: c.status(), timeout_s=10.0)
    if status is None:
        return code or EXIT_ENVIRONMENT
    status.pop("id", None)
    status.pop("ok", None)
    if model is not None:
        chosen = [m for m in status["models"] if m["name"] == model]
        if not chosen:
            served = ", ".join(m["name"] for m in status["models"]) or "none"
            print(
                f"hotreload status: no model named {model!r}; the session serves: {served}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        status["models"] = chosen
    if as_json:
        print(json.dumps(status, indent=2))
    else:
        print(format_status(status))
    return EXIT_OK


def adapter_lines(adapters: dict[str, Any] | None) -> list[str]:
    """A model's peft adapters under its weights line: each one's digest, the default
    marked, and the base's digest."""
    if not adapters:
        return []
    default = adapters.get("default")
    lines = []
    for name, a in (adapters.get("adapters") or {}).items():
        mark = " (default)" if name == default else ""
        lines.append(f"  adapter {name}{mark} {a.get('digest')} from {a.get('source')}")
    base = " (default)" if default == "base" else ""
    lines.append(f"  base{base} {adapters.get('base_digest') or 'hashing'}")
    return lines

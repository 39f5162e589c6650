"""`hotreload diff MODEL [A] [B]`: two kept versions' golden outputs compared.

Each version's golden outputs (the example and the config's `golden` inputs) are kept in
the session's state folder as it builds them (engine/golden.py `GoldenStore`, the last
few versions of one session: a session's first build clears its model's folder, as its
version numbers start again at 1), so nothing runs again: the files are read and compared,
within the config's `tolerance` (or `--tolerance`). It says which session's versions it
read. Default: the serving version (asked of the running session; without one, or when the
folder holds another session's, the newest kept) and the one kept before it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from hotreload.config import load_config
from hotreload.engine.golden import GoldenMissing, GoldenStore, diff_kept
from hotreload.engine.golden_text import summary
from hotreload.errors import ClientError, ConfigError
from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, error_exit


def _serving(config: str | None, model: str) -> tuple[int | None, int | None]:
    """The version the running session serves and that session's pid (None, None: no
    session; a None version: it does not serve this model)."""
    from hotreload.client import Client

    try:
        status = Client(config, timeout_s=5.0).status()
    except (ClientError, TimeoutError, OSError):
        return None, None
    pid = status.get("pid")
    for m in status.get("models", []):
        if m.get("name") == model and m.get("version"):
            return int(m["version"]), pid
    return None, pid


def session_line(marker: dict[str, Any] | None, running_pid: int | None) -> str:
    """Which session's versions the folder holds."""
    if marker is None:
        return "golden outputs of an unnamed session (kept before sessions were named)"
    started = marker.get("started_at")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        if isinstance(started, (int, float))
        else "?"
    )
    pid = marker.get("pid")
    state = "the running session" if pid == running_pid else "a session that has ended"
    return f"golden outputs of {state} (pid {pid}, started {when})"


def format_diff(diff: dict[str, Any]) -> str:
    """The summary line, then a line per output and per prompt."""
    lines = [f"v{diff['from']} -> v{diff['to']}: {summary(diff)}"]
    for e in diff["outputs"]:
        if e.get("note"):
            lines.append(f"  {e['output']}: {e['note']}")
            continue
        if e.get("max_abs") is None:
            lines.append(f"  {e['output']}: {'changed' if e['changed'] else 'same'}")
            continue
        rel = f", max rel {e['max_rel']:.3g}" if e.get("max_rel") is not None else ""
        flips = f", top-1 flips {e['flips']}/{e['positions']}" if e.get("flips") is not None else ""
        lines.append(f"  {e['output']}: max abs {e['max_abs']:.3g}{rel}{flips}")
    for t in diff["texts"]:
        where = f"first differing token {t['first_token']}" if t["changed"] else "same tokens"
        lines.append(f"  prompt {t['index']} {t['prompt']!r}: {where}")
        if t["changed"]:
            lines.append(f"    v{diff['from']}: {t['old']!r}")
            lines.append(f"    v{diff['to']}: {t['new']!r}")
    return "\n".join(lines)


def diff_main(
    config: str | None,
    model: str,
    a: int | None,
    b: int | None,
    *,
    as_json: bool = False,
    tolerance: float | None = None,
) -> int:
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        return error_exit("hotreload diff", exc)
    by_name = {m.name: m for m in cfg.models}
    if model not in by_name:
        served = ", ".join(by_name) or "none"
        print(
            f"hotreload diff: no model named {model!r}; the config has: {served}", file=sys.stderr
        )
        return EXIT_USAGE
    if tolerance is not None and not (tolerance >= 0 and tolerance != float("inf")):
        print(
            f"hotreload diff: --tolerance {tolerance}: give the largest absolute difference "
            "still the same, a number 0 or more (0: bit-equal)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # The gate's own bound by default: diff says "changed" where the gate did, no more.
    tol = by_name[model].tolerance if tolerance is None else tolerance
    store = GoldenStore(cfg.state_dir / "golden" / model)
    marker = store.session()
    serving, pid = _serving(config, model)
    ours = marker is not None and marker.get("pid") == pid
    try:
        # The serving version names a file of this session only: another's numbers differ.
        diff = diff_kept(store, model, a, b, serving if ours else None, tolerance=tol)
    except GoldenMissing as exc:
        print(f"hotreload diff: {exc}", file=sys.stderr)
        print(f"hotreload diff: {session_line(marker, pid)}", file=sys.stderr)
        return EXIT_FAILURE
    diff["session"] = {**(marker or {}), "running": ours}
    if as_json:
        print(json.dumps(diff, indent=2, allow_nan=False))
    else:
        print(format_diff(diff))
        print(session_line(marker, pid))
    return EXIT_OK

"""Plain mode (commands/printer.py): one line per event, from a table of formatters.

The expected lines are what the if-chain that the table replaced printed for the same
events; every kind of engine/event_kinds.py is either printed or deliberately silent. The
printer takes the event objects the bus hands out; a case is written as its events.jsonl
line, for reading, and built with `from_dict` (strict: every case is a whole event).
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from hotreload.commands.printer import (
    EVENT_STYLES,
    FORMATTERS,
    SILENT_KINDS,
    PlainPrinter,
    format_event,
)
from hotreload.engine.event_kinds import EVENT_TYPES, State
from hotreload.engine.events import from_dict
from tests.test_event_kinds import sample

TRACEBACK = "Traceback (most recent call last):\n  File x\nValueError: boom\n"

#: (event, the line plain mode prints for it, or None).
CASES: list[tuple[dict[str, Any], str | None]] = [
    (
        {
            "kind": "ready",
            "model": "mlp",
            "version": 2,
            "device": "cuda:0",
            "pid": 7,
            "load_s": 1.234,
            "warm_s": 0.5,
            "inputs": "x [-1, -1]",
        },
        "mlp: v2 ready on cuda:0 (load 1.23 s, warm-up 0.50 s, worker pid 7); inputs x [-1, -1]",
    ),
    (
        {
            "kind": "ready",
            "model": "mlp",
            "version": 2,
            "device": "cpu",
            "pid": 7,
            "load_s": 0.0,
            "warm_s": 0.0,
            "ts": 0.0,
        },
        "mlp: v2 ready on cpu (load 0.00 s, warm-up 0.00 s, worker pid 7)",
    ),
    (
        {
            "kind": "eval_done",
            "model": "mlp",
            "version": 3,
            "figures": {"loss": 0.41237, "accuracy": 0.875},
            "eval_s": 0.25,
        },
        "mlp: eval v3: loss 0.4124, accuracy 0.875 in 0.25 s",
    ),
    (
        {"kind": "eval_done", "model": "mlp", "version": 3, "error": "eval: boom"},
        "mlp: eval of v3 FAILED: eval: boom (v3 serves on)",
    ),
    (
        {"kind": "model_note", "model": "mlp", "message": "output 'aux' left out"},
        "mlp: note: output 'aux' left out",
    ),
    (
        {
            "kind": "start_failed",
            "model": "mlp",
            "phase": "load",
            "error": "boom",
            "traceback": TRACEBACK,
        },
        "mlp: failed to start in load: boom\n" + TRACEBACK.rstrip(),
    ),
    (
        {"kind": "start_failed", "model": "mlp", "error": "boom"},
        "mlp: failed to start in start: boom",
    ),
    (
        {"kind": "worker_died", "model": "mlp", "pid": 9, "reason": "SIGKILL"},
        "mlp: worker pid 9 died (SIGKILL); restarting",
    ),
    ({"kind": "worker_died", "model": "mlp"}, "mlp: worker pid None died (None); restarting"),
    (
        {"kind": "standby_ready", "model": "mlp", "pid": 11, "recycled": 0},
        "mlp: standby worker pid 11 ready for the next reload",
    ),
    (
        {
            "kind": "standby_ready",
            "model": "mlp",
            "pid": 11,
            "recycled": 2,
            "after": "a failed build",
        },
        "mlp: standby worker pid 11 (kept after a failed build) ready for the next reload",
    ),
    (
        {"kind": "standby_ready", "model": "mlp", "pid": 11, "recycled": 1},
        "mlp: standby worker pid 11 (kept after serving) ready for the next reload",
    ),
    (
        {
            "kind": "snapshot_rewritten",
            "model": "mlp",
            "files": ["w.pt"],
            "message": "w.pt rewritten",
        },
        "mlp: warning: w.pt rewritten",
    ),
    (
        {"kind": "weights_override", "model": "mlp", "version": 3, "message": "v3 answers as v2"},
        "mlp: warning: v3 answers as v2",
    ),
    (
        {
            "kind": "reload_done",
            "model": "mlp",
            "version": 4,
            "total_s": 0.25,
            "policy": "availability",
            "strategy": "inplace",
            "phases": {},
            "trigger": "push",
            "digest": "sha256:d513bd5d2260c954a6f71d0288c16afa",
        },
        "mlp: reload -> v4 ok in 0.25 s (availability, inplace); weights sha256:d513bd5d",
    ),
    (
        {
            "kind": "checkpoint_wait",
            "model": "mlp",
            "file": "/p/w.safetensors",
            "message": "waiting up to 30 s for w.safetensors to be complete (still being written)",
        },
        "mlp: waiting up to 30 s for w.safetensors to be complete (still being written)",
    ),
    (
        {
            "kind": "lock_wait",
            "model": "mlp",
            "device": "cuda:0",
            "message": "waiting for the cuda:0 reload lock, held by pid 7, model 'bert', "
            "config /p/hotreload.toml",
        },
        "mlp: waiting for the cuda:0 reload lock, held by pid 7, model 'bert', "
        "config /p/hotreload.toml",
    ),
    (
        {
            "kind": "recycle_disabled",
            "model": "mlp",
            "reason": "the model does not survive a second import",
        },
        "mlp: the model does not survive a second import; "
        "from now on each standby is a fresh process",
    ),
    (
        {"kind": "standby_failed", "model": "mlp", "error": "no memory"},
        "mlp: standby worker did not start (no memory); reloads spawn one",
    ),
    (
        {
            "kind": "worker_restarted",
            "model": "mlp",
            "pid": 12,
            "version": 4,
            "reason": "worker died",
        },
        "mlp: worker restarted (pid 12, v4)",
    ),
    (
        {"kind": "restart_failed", "model": "mlp", "attempt": 2, "phase": "load", "error": "bad"},
        "mlp: restart attempt 2 failed in load: bad",
    ),
    (
        {"kind": "wedged", "model": "mlp", "phase": "drain", "detail": "stuck"},
        "mlp: WEDGED in drain: stuck; killing the worker",
    ),
    (
        {
            "kind": "reload_requested",
            "model": "mlp",
            "trigger": "file",
            "detail": "model.py",
            "queued": False,
        },
        "mlp: reload requested by file (model.py)",
    ),
    (
        {"kind": "reload_requested", "model": "mlp", "trigger": "command", "queued": True},
        "mlp: reload requested by command",
    ),
    (
        {"kind": "policy", "model": "mlp", "policy": "availability", "reason": "room for two"},
        "mlp: policy availability (room for two)",
    ),
    (
        {
            "kind": "phase_end",
            "model": "mlp",
            "phase": "load",
            "duration_s": 0.01234,
            "ok": True,
            "skipped": False,
        },
        "mlp:   load        12.3 ms  ok",
    ),
    (
        {
            "kind": "phase_end",
            "model": "mlp",
            "phase": "warm",
            "duration_s": 1.5,
            "ok": False,
            "detail": "warm-up failed",
        },
        "mlp:   warm      1500.0 ms  FAILED - warm-up failed",
    ),
    (
        {
            "kind": "phase_end",
            "model": "mlp",
            "phase": "sync",
            "duration_s": 0.0,
            "ok": True,
            "skipped": True,
            "detail": "nothing to sync",
        },
        "mlp:   sync         0.0 ms  skipped - nothing to sync",
    ),
    (
        {"kind": "phase_end", "model": "mlp", "phase": "lock", "duration_s": 0.0, "ok": True},
        "mlp:   lock         0.0 ms  ok",
    ),
    (
        {
            "kind": "reload_done",
            "model": "mlp",
            "version": 3,
            "total_s": 0.456,
            "policy": "availability",
            "strategy": "inplace",
            "phases": {"load": 0.1},
            "trigger": "file",
        },
        "mlp: reload -> v3 ok in 0.46 s (availability, inplace)",
    ),
    (
        {
            "kind": "reload_done",
            "model": "bert",
            "version": 5,
            "total_s": 14.2,
            "policy": "availability",
            "strategy": "inplace",
            "phases": {"warm": 13.9},
            "trigger": "file",
            "compile": {
                "compiles": 3,
                "seconds": 13.21,
                "hits": 4,
                "misses": 1,
                "cache": {"fx_hit": 4, "fx_miss": 1},
                "reasons": ["0/0: tensor 'args[0]' size mismatch at index 0. expected 1, actual 2"],
            },
        },
        "bert: reload -> v5 ok in 14.20 s (availability, inplace); compiled 13.21 s (3 compiles; "
        "cache 4 hit(s), 1 miss(es)); recompiled: 0/0: tensor 'args[0]' size mismatch at index "
        "0. expected 1, actual 2",
    ),
    (
        {
            "kind": "reload_failed",
            "model": "mlp",
            "version": 2,
            "phase": "load",
            "error": "SyntaxError",
            "trigger": "file",
            "traceback": "Traceback\n  line\nSyntaxError\n",
        },
        "mlp: reload FAILED in load: SyntaxError - v2 keeps serving\n"
        "Traceback\n  line\nSyntaxError",
    ),
    (
        {
            "kind": "reload_failed",
            "model": "mlp",
            "version": 2,
            "error": "internal",
            "trigger": "file",
        },
        "mlp: reload FAILED in None: internal - v2 keeps serving",
    ),
    (
        {"kind": "watch_error", "error": "inotify watch limit reached"},
        "watcher: inotify watch limit reached",
    ),
    (
        {"kind": "file_unused", "path": "/p/client.py"},
        "watcher: /p/client.py is not used by any model: nothing reloads (list it in a "
        "model's `watch` if its build reads it)",
    ),
    ({"kind": "watch_paused"}, "watcher paused: edits are not reloaded until it resumes"),
    (
        {"kind": "watch_waiting", "waiting": 1},
        "watcher paused: 1 change waiting (applied on resume)",
    ),
    (
        {"kind": "watch_waiting", "waiting": 3},
        "watcher paused: 3 changes waiting (applied on resume)",
    ),
    ({"kind": "watch_resumed", "waiting": 0}, "watcher resumed"),
    (
        {"kind": "watch_resumed", "waiting": 1},
        "watcher resumed: reloading 1 change made while paused",
    ),
    (
        {"kind": "watch_resumed", "waiting": 2},
        "watcher resumed: reloading 2 changes made while paused",
    ),
    (
        {
            "kind": "watching",
            "paths": ["/a", "/b"],
            "files": 3,
            "quiet_ms": 150,
            "max_wait_ms": 1000,
            "mode": "inotify",
        },
        "watching /a, /b (quiet 150 ms)",
    ),
    (
        {
            "kind": "rewarm_done",
            "model": "mlp",
            "warm_s": 0.0123,
            "passes_ms": [1.0, 2.25, 3, 4, 5, 6, 7],
        },
        "mlp: warm-up re-run in 12 ms (1.0, 2.2, 3.0, 4.0, 5.0 ms)",
    ),
    ({"kind": "config_error", "error": "bad toml"}, "config error: bad toml"),
    ({"kind": "config_changed", "detail": "hotreload.toml changed"}, "hotreload.toml changed"),
    (
        {
            "kind": "http_started",
            "url": "http://127.0.0.1:8000",
            "host": "127.0.0.1",
            "port": 8000,
            "metrics_url": "http://127.0.0.1:8000/metrics",
        },
        "http: listening on http://127.0.0.1:8000\nhttp: metrics on http://127.0.0.1:8000/metrics",
    ),
    (
        {"kind": "cpus", "serving": {"mlp": [0]}, "rest": [1, 2], "detail": "mlp on 0; rest 1-2"},
        "cpus: mlp on 0; rest 1-2",
    ),
    (
        {"kind": "cpus_failed", "model": "mlp", "pid": 7, "detail": "could not move"},
        "mlp: warning: worker pid 7: could not move",
    ),
    (
        {"kind": "events_file_error", "message": "cannot write events.jsonl"},
        "warning: cannot write events.jsonl",
    ),
    (
        {"kind": "events_file_resumed", "lost": 0, "message": "writing events.jsonl again"},
        "writing events.jsonl again",
    ),
    ({"kind": "gpu_unavailable", "reason": "no NVIDIA driver"}, "no GPU data: no NVIDIA driver"),
    (
        {"kind": "gpu_reset", "model": "mlp", "ok": True, "message": "reset GPU 0"},
        "mlp: GPU reset done: reset GPU 0",
    ),
    (
        {"kind": "gpu_reset", "model": "mlp", "ok": False, "message": "press x"},
        "mlp: GPU reset not done: press x",
    ),
    (
        {
            "kind": "xid_sources",
            "sources": [
                {"name": "nvml", "active": False, "reason": "no"},
                {"name": "kmsg", "active": True, "reason": None},
            ],
        },
        "Xid sources: nvml off (no); kmsg on",
    ),
    (
        {
            "kind": "xid",
            "xid": 79,
            "name": "GPU has fallen off the bus",
            "severity": "critical",
            "pci": "0000:65:00",
            "action": "reset the GPU",
            "text": "NVRM: Xid (PCI:0000:65:00): 79, GPU has fallen off the bus.",
            "received_at": 1.0,
            "source": "kmsg",
            "known": True,
            "inferred": False,
            "also_from": [],
        },
        "Xid 79 (GPU has fallen off the bus, critical) on 0000:65:00: reset the GPU",
    ),
    ({"kind": "state", "model": "mlp", "state": "serving", "version": 2}, None),
    ({"kind": "phase_start", "model": "mlp", "phase": "load"}, None),
    ({"kind": "session_started", "socket": "/s", "pid": 1, "models": ["mlp"]}, None),
]


@pytest.mark.parametrize(("event", "line"), CASES, ids=[str(c[0].get("kind")) for c in CASES])
def test_each_event_prints_its_line(event: dict[str, Any], line: str | None) -> None:
    assert format_event(from_dict(event)) == line


def test_every_kind_is_printed_or_deliberately_silent() -> None:
    kinds = set(EVENT_TYPES.values())
    assert set(FORMATTERS) - kinds == set(), "a formatter for a kind nobody declares"
    assert SILENT_KINDS - kinds == set(), "a silent kind nobody declares"
    assert set(FORMATTERS) & SILENT_KINDS == set(), "printed and silent at once"
    missing = kinds - set(FORMATTERS) - SILENT_KINDS
    assert missing == set(), (
        f"give {sorted(missing)} a formatter in commands/printer.py, or list them in SILENT_KINDS"
    )
    assert set(EVENT_STYLES) <= set(FORMATTERS), "a colour for a line never printed"


def test_the_cases_cover_every_formatter_and_silent_kinds_print_nothing() -> None:
    assert {EVENT_TYPES[c[0]["kind"]] for c in CASES} >= set(FORMATTERS)
    for cls in SILENT_KINDS:
        assert format_event(sample(cls, optional=True)) is None


def test_the_printer_colours_the_first_line_and_dims_a_traceback() -> None:
    out = io.StringIO()
    event = {
        "kind": "reload_failed",
        "model": "mlp",
        "version": 2,
        "phase": "load",
        "error": "boom",
        "trigger": "file",
        "traceback": TRACEBACK,
        "ts": 0.0,
    }
    PlainPrinter(out, timestamps=False, colour=True)(from_dict(event))
    head, _, rest = out.getvalue().partition("\n")
    assert "\x1b[" in head and "mlp: reload FAILED in load: boom" in head
    assert "ValueError: boom" in rest and "\x1b[2m" in rest
    plain = io.StringIO()
    PlainPrinter(plain, timestamps=False, colour=False)(State(model="mlp", state="serving"))
    assert plain.getvalue() == ""


def test_a_multi_line_error_prints_once_in_a_failed_reload() -> None:
    """`watch --no-tui` after an edit that no longer fits the weights: the size-mismatch
    error (a line per tensor) reads once, on the reload's FAILED line."""
    error = (
        "weights do not match the model: Error(s) in loading state_dict for MLP:\n"
        "\tsize mismatch for inp.weight: copying a param with shape torch.Size([512, 64]) "
        "from checkpoint, the shape in current model is torch.Size([256, 64]).\n"
        "\tsize mismatch for inp.bias: copying a param with shape torch.Size([512]) from "
        "checkpoint, the shape in current model is torch.Size([256]).; check that the "
        "weights file was saved from this model's code"
    )
    out = io.StringIO()
    printer = PlainPrinter(out, timestamps=False, colour=False)
    printer(from_dict(
        {"kind": "phase_end", "model": "mlp", "phase": "load", "duration_s": 0.027,
         "ok": False, "detail": error}
    ))  # fmt: skip
    printer(from_dict(
        {"kind": "reload_failed", "model": "mlp", "version": 1, "phase": "load",
         "error": error, "trigger": "file"}
    ))  # fmt: skip
    text = out.getvalue()
    assert text.count("size mismatch for inp.weight") == 1
    assert text.count("check that the weights file was saved") == 1
    phase_line, failed = text.split("\n", 1)
    # The phase's line still says what failed, in one line.
    assert phase_line == (
        "mlp:   load        27.0 ms  FAILED - weights do not match the model: Error(s) in "
        "loading state_dict for MLP: …"
    )
    assert failed.startswith("mlp: reload FAILED in load: weights do not match the model")
    assert failed.rstrip().endswith("- v1 keeps serving")

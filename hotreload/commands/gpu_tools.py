"""`hotreload xid` and `hotreload doctor`: thin argument parsing over plain functions."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE, exit_code_for


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the GPU layer's subcommands to the main parser."""
    p = sub.add_parser(
        "xid",
        help="show NVIDIA Xid errors from a saved log, stdin, or the live kernel log",
        description="Print each Xid event with time, bus id, device, code, name, severity, "
        "process and recommended action. Without --from, reads the current kernel log. "
        "Typical use: `hotreload xid --follow` while a job runs.",
    )
    p.add_argument("--from", dest="source", metavar="FILE|-", help="read a saved log ('-': stdin)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep reading: the live kernel log and NVML events, or FILE as it grows",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--for", dest="duration", type=float, metavar="SECONDS", help="stop following after this"
    )
    p.set_defaults(func=cmd_xid)

    p = sub.add_parser(
        "doctor",
        help="check the GPU, driver, torch and file-watch setup",
        description="Check what serving on this machine needs: NVML, torch and the GPUs it "
        "sees, cuda-python, the Xid sources, recent Xids, GPU reset, torch threads and the "
        "inotify limit for the watched tree. Typical use: `hotreload doctor` when a model "
        "will not start on the GPU or edits do not reload.",
    )
    p.add_argument(
        "--config",
        metavar="PATH",
        help="config file; its folder is the tree counted for the inotify check",
    )
    p.add_argument(
        "--watch",
        action="append",
        type=Path,
        metavar="DIR",
        help="folder to count for the inotify check (repeatable; default: the current folder)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_doctor)


def _emit(ev: object, as_json: bool, out: TextIO) -> None:
    from hotreload.gpu.xid_events import XidEvent, event_to_json, format_event

    assert isinstance(ev, XidEvent)
    out.write((json.dumps(event_to_json(ev)) if as_json else format_event(ev)) + "\n")
    out.flush()


def _tail(f: TextIO, stop: threading.Event, poll_s: float = 0.2) -> Iterator[str]:
    """Lines of `f`, then lines appended to it, until `stop` is set."""
    buf = ""
    while not stop.is_set():
        chunk = f.readline()
        if chunk:
            buf += chunk
            if buf.endswith("\n"):
                yield buf
                buf = ""
            continue
        if f is sys.stdin:  # stdin at EOF will not grow
            break
        stop.wait(poll_s)
    if buf:
        yield buf


def _print_lines(lines: Iterable[str], as_json: bool, out: TextIO, where: str) -> None:
    """Each Xid event in `lines`; in text mode a line saying so when there is none (an empty
    output reads as a command that did nothing). JSON output stays one object per event."""
    from hotreload.gpu.xid_parse import parse_lines

    seen = 0
    for ev in parse_lines(lines, source="file"):
        _emit(ev, as_json, out)
        seen += 1
    if not seen and not as_json:
        out.write(f"no Xid events in {where}\n")


_KERNEL_LOG_HINT = (
    "  run it as root, join the adm or systemd-journal group, or pipe a log in: "
    "`sudo dmesg | hotreload xid --from -`"
)


def _stop_after(duration: float | None, stop: threading.Event | None = None) -> threading.Event:
    """`stop`, or a new event, set once `duration` seconds have passed (never if None)."""
    stop = stop or threading.Event()
    if duration is not None:
        timer = threading.Timer(duration, stop.set)
        timer.daemon = True
        timer.start()
    return stop


def xid_main(
    source: str | None,
    follow: bool = False,
    as_json: bool = False,
    duration: float | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stop: threading.Event | None = None,
) -> int:
    """The work behind `hotreload xid`. With `follow`, setting `stop` ends it, as does
    `duration` running out."""
    # Resolved per call, not at import: tests and embedding callers swap sys.stdout.
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if source is not None:
            return _xid_from_file(source, follow, as_json, _stop_after(duration, stop), out, err)
        if follow:
            return _xid_follow_live(as_json, _stop_after(duration, stop), out, err)
        from hotreload.gpu.kernel_log import read_kernel_log_once

        lines, how = read_kernel_log_once()
        if lines is None:
            err.write(f"hotreload xid: cannot read the kernel log: {how}\n{_KERNEL_LOG_HINT}\n")
            return EXIT_ENVIRONMENT
        _print_lines(lines, as_json, out, "the kernel log")
        return EXIT_OK
    except KeyboardInterrupt as exc:
        return exit_code_for(exc)
    except BrokenPipeError:  # `hotreload xid | head`
        return EXIT_OK


def _xid_from_file(
    source: str, follow: bool, as_json: bool, stop: threading.Event, out: TextIO, err: TextIO
) -> int:
    if source == "-":
        f: TextIO = sys.stdin
    else:
        try:
            f = open(source, encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError as exc:
            err.write(
                f"hotreload xid: cannot read {source}: {exc.strerror or exc}; "
                "give a readable log file, or '-' to read stdin\n"
            )
            return EXIT_USAGE
    try:
        where = "stdin" if f is sys.stdin else source
        _print_lines(_tail(f, stop) if follow else f, as_json, out, where)
    finally:
        if f is not sys.stdin:
            f.close()
    return EXIT_OK


def _xid_follow_live(as_json: bool, stop: threading.Event, out: TextIO, err: TextIO) -> int:
    from hotreload.gpu.xid import XidMonitor

    lock = threading.Lock()

    def on_event(ev: object) -> None:
        with lock:
            _emit(ev, as_json, out)

    monitor = XidMonitor(on_event)
    monitor.start()
    try:
        monitor.wait_ready(timeout=10)
        for s in monitor.sources:
            state = "active" if s.active else "inactive"
            err.write(f"xid source {s.name}: {state} ({s.reason})\n")
        err.flush()
        if not any(s.active for s in monitor.sources):
            err.write(f"hotreload xid: no Xid source can be read\n{_KERNEL_LOG_HINT}\n")
            return EXIT_ENVIRONMENT
        while not stop.wait(0.2):
            if not any(s.active for s in monitor.sources):
                reasons = "; ".join(f"{s.name}: {s.reason}" for s in monitor.sources)
                err.write(
                    f"hotreload xid: every Xid source stopped ({reasons}); "
                    "`hotreload doctor` checks what this machine can read\n"
                )
                return EXIT_ENVIRONMENT
        return EXIT_OK
    except KeyboardInterrupt as exc:
        return exit_code_for(exc)
    finally:
        monitor.stop(timeout=3)


def cmd_xid(args: argparse.Namespace) -> int:
    return xid_main(args.source, args.follow, args.json, args.duration)


def cmd_doctor(args: argparse.Namespace) -> int:
    from hotreload.gpu.doctor import run_doctor

    dirs: list[Path] | None = list(args.watch) if args.watch else None
    if dirs is None and args.config:
        config = Path(args.config)
        if not config.is_file():
            sys.stderr.write(
                f"hotreload doctor: config not found: {config}; pass an existing file, "
                "or the folders to check with --watch DIR\n"
            )
            return EXIT_USAGE
        dirs = [config.resolve().parent]
    return run_doctor(watch_dirs=dirs, as_json=args.json)


__all__ = ["cmd_doctor", "cmd_xid", "register", "xid_main"]

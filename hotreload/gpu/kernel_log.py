"""Following the kernel log as lines: `/dev/kmsg`, else `journalctl -k -f`, else `dmesg -w`.

Each follower yields raw text lines (no parsing) and stops promptly when its stop event is
set, so the Xid monitor's thread can be joined within a fraction of a second. Which one is
used depends on what this user can read; `probe_kernel_log()` says which and why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

KMSG_PATH = "/dev/kmsg"
# A /dev/kmsg record: "prio,seq,usec,flags[,...];message".
_KMSG_RECORD = re.compile(rb"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
# kmsg's escape for unprintable bytes (newline, backslash, non-ASCII) in a message.
_KMSG_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_UPTIME_PREFIX = re.compile(r"^\s*\[\s*(\d+\.\d+)\]")


@dataclass(frozen=True)
class KernelLogChoice:
    """Which kernel-log reader works for this user, or why none does."""

    method: str | None  # "kmsg", "journalctl", "dmesg" or None
    detail: str


def _can_read_kmsg(path: str) -> tuple[bool, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        return False, f"{path}: permission denied (kernel.dmesg_restrict=1; needs CAP_SYSLOG)"
    except OSError as exc:
        return False, f"{path}: {exc.strerror or exc}"
    os.close(fd)
    return True, f"following {path}"


def _command_works(cmd: Sequence[str], timeout_s: float = 5.0) -> tuple[bool, str]:
    try:
        out = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{cmd[0]}: {exc}"
    err = out.stderr.strip()
    # journalctl exits 0 but says so when it may not read the system journal.
    if out.returncode != 0 or "insufficient permissions" in err.lower():
        return False, f"{' '.join(cmd)}: {err.splitlines()[0] if err else out.returncode}"
    return True, ""


def probe_kernel_log(kmsg_path: str = KMSG_PATH) -> KernelLogChoice:
    """Pick the first kernel-log reader this user can use."""
    ok, why_kmsg = _can_read_kmsg(kmsg_path)
    if ok:
        return KernelLogChoice("kmsg", why_kmsg)
    reasons = [why_kmsg]
    if shutil.which("journalctl"):
        ok, why = _command_works(["journalctl", "-k", "-n", "0", "-q", "--no-pager"])
        if ok:
            return KernelLogChoice("journalctl", "following journalctl -k -f")
        reasons.append(why)
    else:
        reasons.append("journalctl not found")
    if shutil.which("dmesg"):
        ok, why = _command_works(["dmesg", "-t"])
        if ok:
            return KernelLogChoice("dmesg", "following dmesg -w")
        reasons.append(why)
    else:
        reasons.append("dmesg not found")
    return KernelLogChoice(None, "; ".join(reasons))


def _uptime() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kmsg_record_lines(raw: bytes) -> list[str]:
    """One /dev/kmsg record as the lines `dmesg` would print for it.

    kmsg escapes newlines and other unprintable bytes as `\\xNN`; a multi-line message
    (the driver's "fallen off the bus" report is one) becomes its lines again, the first
    prefixed with "[  uptime]", the rest indented like dmesg's continuation lines.
    """
    m = _KMSG_RECORD.match(raw)
    if m is None:
        text = raw.decode("utf-8", "replace")
        return [text] if text else []
    usec = int(m.group(3))
    body = _KMSG_ESCAPE.sub(lambda e: bytes([int(e.group(1), 16)]), m.group(4))
    first, *rest = body.decode("utf-8", "replace").split("\n")
    return [f"[{usec / 1e6:12.6f}] {first}", *(f"{' ' * 15}{line}" for line in rest)]


def follow_kmsg(stop: threading.Event, path: str = KMSG_PATH, poll_s: float = 0.2) -> Iterator[str]:
    """Yield each new record's message from /dev/kmsg (older records are skipped).

    Records are prefixed with "[  uptime]" so the parser sees the same form as `dmesg`.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        # SEEK_END on /dev/kmsg means "only records from now on"; a FIFO cannot seek.
        with contextlib.suppress(OSError):
            os.lseek(fd, 0, os.SEEK_END)
        pending = b""
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], poll_s)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them
                    continue
                raise
            if not chunk:  # a writer closed a FIFO (tests); real kmsg never ends
                if stop.wait(poll_s):
                    break
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                if raw.startswith(b" "):  # continuation line ("KEY=value" dictionary)
                    continue
                yield from kmsg_record_lines(raw)
    finally:
        os.close(fd)


def _follow_process(
    stop: threading.Event, cmd: Sequence[str], poll_s: float, min_uptime: float | None = None
) -> Iterator[str]:
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    pending = b""
    try:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], poll_s)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(fd, 8192)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                if min_uptime is not None:
                    # `dmesg -w` replays the whole ring first; drop what predates the monitor.
                    m = _UPTIME_PREFIX.match(text)
                    if m and float(m.group(1)) < min_uptime:
                        continue
                yield text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=2)
        proc.stdout.close()


def follow_kernel_log(
    stop: threading.Event, method: str, kmsg_path: str = KMSG_PATH, poll_s: float = 0.2
) -> Iterator[str]:
    """Yield new kernel-log lines with the chosen method until `stop` is set."""
    if method == "kmsg":
        yield from follow_kmsg(stop, kmsg_path, poll_s)
    elif method == "journalctl":
        yield from _follow_process(
            stop, ["journalctl", "-k", "-f", "-n", "0", "-q", "-o", "short-iso"], poll_s
        )
    elif method == "dmesg":
        start = _uptime()
        # --follow-new (util-linux >= 2.37) skips old records; older dmesg gets -w and the
        # uptime filter instead.
        t0 = time.monotonic()
        yield from _follow_process(stop, ["dmesg", "--follow-new"], poll_s)
        if not stop.is_set() and time.monotonic() - t0 < 2:
            yield from _follow_process(stop, ["dmesg", "-w"], poll_s, min_uptime=start)
    else:
        raise ValueError(f"unknown kernel log method {method!r}")


def read_kernel_log_once(timeout_s: float = 10.0) -> tuple[list[str] | None, str]:
    """The current kernel ring buffer as lines (for `doctor`), or None and why not."""
    cmds: list[list[str]] = []
    if shutil.which("dmesg"):
        cmds.append(["dmesg"])
    if shutil.which("journalctl"):
        cmds.append(["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-iso"])
    reasons = []
    for cmd in cmds:
        try:
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                errors="replace",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{cmd[0]}: {exc}")
            continue
        if out.returncode == 0 and "insufficient permissions" not in out.stderr.lower():
            return out.stdout.splitlines(), " ".join(cmd)
        first = out.stderr.strip().splitlines()[:1]
        reasons.append(f"{cmd[0]}: {first[0] if first else out.returncode}")
    if not cmds:
        reasons.append("neither dmesg nor journalctl found")
    return None, "; ".join(reasons)

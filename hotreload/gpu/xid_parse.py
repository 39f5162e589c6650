"""Parsing `NVRM: Xid` kernel-log lines in every form real logs use.

Only the part from `NVRM:` on is parsed strictly; whatever precedes it (uptime, syslog or
journald prefix in any locale, host name, remote-log tag, kmsg priority) is only searched
for a time stamp, so an unfamiliar prefix never loses an event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace

from hotreload.gpu.nvml import normalize_bus_id
from hotreload.gpu.xid_events import Source, XidEvent, new_event

# "NVRM: Xid (PCI:0000:01:00): 79, ..." or the bus-less "NVRM: Xid 79, ...". `NVRM:` keeps
# NVSwitch "SXid" lines (logged by nvidia-nvswitchN, not NVRM) from matching.
_XID = re.compile(r"NVRM:\s*Xid\s*(?:\((?P<bus>[^()]*)\)\s*:?)?\s*:?\s*(?P<xid>\d+)\b(?P<rest>.*)$")
_FALLEN = re.compile(r"NVRM:.*fallen off the bus", re.IGNORECASE)
_BUS_ID = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?"
_BUS_IN_TEXT = re.compile(rf"(?:PCI:)?(?P<bus>{_BUS_ID})")
_PID = re.compile(r"pid\s*=\s*(?:'?<unknown>'?|'?(?P<pid>\d+)'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name\s*=\s*(?P<name>.*?)(?:,\s+|,$|$)")
_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<label>[^)]*)\)")
# First line of the driver's multi-line "fallen off the bus" report.
_GPU_HEAD = re.compile(rf"NVRM: The NVIDIA GPU (?P<bus>{_BUS_ID})\s*$")

# Time stamps, most specific first.
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_BRACKET_CLOCK = re.compile(r"\[(?P<ts>[^\]]*\d{1,2}:\d{2}:\d{2}[^\]]*)\]")  # dmesg -T
# syslog / journald "Mon DD HH:MM:SS" with the month in any locale ("Jan", "Mär", "3月").
_SYSLOG = re.compile(r"(?P<ts>\S+\s+\d{1,2}\s+\d{1,2}:\d{2}:\d{2}(?:\.\d+)?)")
_UPTIME = re.compile(r"\[\s*(?P<ts>\d+\.\d+)\]")


_PRIORITY = re.compile(r"<\d{1,3}>")  # "<4>" priority tags from remote syslog


def _timestamp(prefix: str) -> str | None:
    prefix = _PRIORITY.sub("", prefix)
    for pattern in (_ISO, _BRACKET_CLOCK, _SYSLOG, _UPTIME):
        m = pattern.search(prefix)
        if m:
            return (m.groupdict().get("ts") or m.group(0)).strip()
    return None


def _strip_pci(text: str) -> str:
    text = text.strip()
    return text[4:] if text[:4].upper() == "PCI:" else text


def _event(
    code: int,
    pci: str | None,
    pid: int | None,
    process: str | None,
    text: str,
    timestamp: str | None,
    source: Source,
    inferred: bool = False,
) -> XidEvent:
    action = None
    if code == 154:
        # Xid 154 carries the driver's own verdict; show it rather than the generic advice.
        m = _RECOVERY.search(text)
        if m:
            action = f"Driver asks: {m.group('label')}."
    return new_event(
        code,
        action=action,
        pci=pci or None,
        bus=normalize_bus_id(pci) if pci else None,
        device_index=None,
        pid=pid,
        process=process,
        text=text,
        timestamp=timestamp,
        received_at=time.time(),
        source=source,
        inferred=inferred,
    )


def parse_line(line: str, source: Source = "file") -> XidEvent | None:
    """The Xid event in one log line, or None for lines that are not Xid reports."""
    line = line.rstrip("\r\n")
    m = _XID.search(line)
    if m is not None:
        prefix = line[: m.start()]
        rest = m.group("rest").lstrip(" ,:").rstrip()
        pid: int | None = None
        process: str | None = None
        pm = _PID.match(rest)
        if pm:
            pid = int(pm.group("pid")) if pm.group("pid") else None
            rest = rest[pm.end() :]
        nm = _NAME.match(rest)
        if nm:
            name = nm.group("name").strip()
            process = None if name in ("", "<unknown>", "'<unknown>'") else name
            rest = rest[nm.end() :]
        bus_text = m.group("bus")
        pci = _strip_pci(bus_text) if bus_text is not None else None
        return _event(
            int(m.group("xid")), pci, pid, process, rest.strip(), _timestamp(prefix), source
        )
    fm = _FALLEN.search(line)
    if fm is not None and "xid" not in line[fm.start() :].lower():
        start = line.index("NVRM:", fm.start())
        body = line[start + len("NVRM:") :].strip()
        bm = _BUS_IN_TEXT.search(body)
        return _event(
            79,
            bm.group("bus") if bm else None,
            None,
            None,
            body,
            _timestamp(line[:start]),
            source,
            inferred=True,
        )
    return None


class XidLineParser:
    """`parse_line` for a stream of lines, which also reads the one report the driver spreads
    over several lines (dmesg, journalctl and saved logs print it that way):

        [ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
                       NVRM: (PCI ID: 10de:26b5) installed in this system has
                       NVRM: fallen off the bus and is not responding to commands.

    The last line alone is an Xid 79 of no known GPU and no time; the parser takes the bus
    id and the time from the first line, so the loss is tied to its GPU.
    """

    #: How many lines after "The NVIDIA GPU <bus>" its "fallen off the bus" line may come.
    HEAD_REACH = 3

    def __init__(self, source: Source = "file") -> None:
        self.source: Source = source
        self._head: tuple[str, str | None] | None = None  # (bus id, timestamp)
        self._since_head = 0

    def feed(self, line: str) -> XidEvent | None:
        """The Xid event that `line` completes, or None."""
        ev = parse_line(line, self.source)
        head = _GPU_HEAD.search(line)
        if head is not None:
            self._head = (head.group("bus"), _timestamp(line[: head.start()]))
            self._since_head = 0
            return ev
        if self._head is None:
            return ev
        self._since_head += 1
        if ev is not None and ev.inferred and ev.pci is None:
            bus, ts = self._head
            ev = replace(ev, pci=bus, bus=normalize_bus_id(bus), timestamp=ev.timestamp or ts)
        if ev is not None or self._since_head >= self.HEAD_REACH:
            self._head = None
        return ev


def parse_lines(lines: Iterable[str], source: Source = "file") -> Iterator[XidEvent]:
    """The Xid events in `lines`, in order; other lines are skipped silently."""
    parser = XidLineParser(source)
    for line in lines:
        ev = parser.feed(line)
        if ev is not None:
            yield ev

"""Parsing `NVRM: Xid` kernel-log lines in every form real logs use.

Only the part from `NVRM:` on is parsed strictly; whatever precedes it (uptime, syslog or
journald prefix in any locale, host name, remote-log tag, kmsg priority) is only searched
for a time stamp, so an unfamiliar prefix never loses an event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator

from hotreload.gpu.nvml import normalize_bus_id
from hotreload.gpu.xid_events import Source, XidEvent, lookup

# "NVRM: Xid (PCI:0000:01:00): 79, ..." or the bus-less "NVRM: Xid 79, ...". `NVRM:` keeps
# NVSwitch "SXid" lines (logged by nvidia-nvswitchN, not NVRM) from matching.
_XID = re.compile(r"NVRM:\s*Xid\s*(?:\((?P<bus>[^()]*)\)\s*:?)?\s*:?\s*(?P<xid>\d+)\b(?P<rest>.*)$")
_FALLEN = re.compile(r"NVRM:.*fallen off the bus", re.IGNORECASE)
_BUS_IN_TEXT = re.compile(
    r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)"
)
_PID = re.compile(r"pid\s*=\s*(?:'?<unknown>'?|'?(?P<pid>\d+)'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name\s*=\s*(?P<name>.*?)(?:,\s+|,$|$)")
_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<label>[^)]*)\)")

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
    info = lookup(code)
    action = info.action
    if code == 154:
        # Xid 154 carries the driver's own verdict; show it rather than the generic advice.
        m = _RECOVERY.search(text)
        if m:
            action = f"Driver asks: {m.group('label')}."
    return XidEvent(
        xid=code,
        pci=pci or None,
        bus=normalize_bus_id(pci) if pci else None,
        device_index=None,
        pid=pid,
        process=process,
        name=info.name,
        severity=info.severity,
        action=action,
        text=text,
        timestamp=timestamp,
        received_at=time.time(),
        source=source,
        known=info.known,
        mnemonic=info.mnemonic,
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


def parse_lines(lines: Iterable[str], source: Source = "file") -> Iterator[XidEvent]:
    """The Xid events in `lines`, in order; other lines are skipped silently."""
    for line in lines:
        ev = parse_line(line, source)
        if ev is not None:
            yield ev

"""Xid events and NVIDIA's Xid catalog (shipped as package data `data/xid_catalog.json`)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal

SEVERITIES = ("application", "driver", "hardware", "informational")
Source = Literal["kmsg", "nvml", "file"]


@dataclass(frozen=True)
class XidInfo:
    """What NVIDIA's catalog says about one Xid code."""

    code: int
    name: str
    #: "application", "driver", "hardware", "informational", or "unknown".
    severity: str
    #: What to do, in a sentence.
    action: str
    #: False for codes the shipped catalog does not list (shown as unknown, never dropped).
    known: bool
    mnemonic: str | None = None


@cache
def _catalog() -> dict[int, XidInfo]:
    text = resources.files("hotreload.gpu").joinpath("data/xid_catalog.json").read_text("utf-8")
    out: dict[int, XidInfo] = {}
    for row in json.loads(text)["xids"]:
        out[int(row["code"])] = XidInfo(
            code=int(row["code"]),
            name=row["name"],
            severity=row["severity"],
            action=row["action"],
            known=True,
            mnemonic=row.get("mnemonic"),
        )
    return out


def catalog_codes() -> tuple[int, ...]:
    """Every code the shipped catalog knows, ascending."""
    return tuple(sorted(_catalog()))


def lookup(code: int) -> XidInfo:
    """The catalog entry for `code`; an `known=False` entry for codes not in it."""
    info = _catalog().get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        name=f"unknown Xid {code}",
        severity="unknown",
        action="Not in hotreload's catalog: look it up in NVIDIA's Xid catalog "
        "(docs.nvidia.com/deploy/xid-errors).",
        known=False,
    )


@dataclass(frozen=True)
class XidEvent:
    """One Xid report, from the kernel log, NVML's event API, or a saved log."""

    xid: int
    #: Bus id as the kernel printed it, without "PCI:" (e.g. "0000:65:00"); None if absent.
    pci: str | None
    #: Bus id normalised to (domain, bus, device); None when absent or redacted.
    bus: tuple[int, int, int] | None
    #: NVML device index for that bus id, where NVML knows it.
    device_index: int | None
    pid: int | None
    process: str | None
    name: str
    severity: str
    action: str
    #: The rest of the line after code, pid and process name.
    text: str
    #: The time as the log printed it (syslog, ISO, dmesg -T or uptime); None if none.
    timestamp: str | None
    #: Wall-clock time (time.time()) when hotreload read it.
    received_at: float
    source: Source
    #: The reload phase running when it arrived ("drain", "sync", ...), if any.
    phase: str | None = None
    known: bool = True
    mnemonic: str | None = None
    #: True for Xid-less "GPU has fallen off the bus" lines counted as Xid 79.
    inferred: bool = False
    #: Other sources that reported the same event (merged into this one).
    also_from: tuple[str, ...] = field(default=())

    @property
    def needs_power_cycle(self) -> bool:
        return self.xid == 79

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> XidEvent:
        """The inverse of `dataclasses.asdict` after a JSON round trip (lists back to tuples)."""
        bus = tuple(d["bus"]) if d.get("bus") is not None else None
        return cls(**{**d, "bus": bus, "also_from": tuple(d.get("also_from") or ())})


def new_event(code: int, *, action: str | None = None, **fields: Any) -> XidEvent:
    """An XidEvent for `code` with its catalog name, severity, action and mnemonic filled in;
    `action` overrides the catalog's advice (Xid 154 carries the driver's own verdict)."""
    info = lookup(code)
    return XidEvent(
        xid=code,
        name=info.name,
        severity=info.severity,
        action=action or info.action,
        known=info.known,
        mnemonic=info.mnemonic,
        **fields,
    )


def event_to_json(ev: XidEvent) -> dict[str, Any]:
    """The `--json` object for one event (stable keys)."""
    d = asdict(ev)
    d["bus"] = "{:04x}:{:02x}:{:02x}".format(*ev.bus) if ev.bus else None
    d["device"] = d.pop("device_index")
    d["also_from"] = list(ev.also_from)
    return d


def format_event(ev: XidEvent) -> str:
    """One human-readable line.

    A line from a saved log or stdin that carries no time of its own shows "(no time)": the
    moment hotreload read it says nothing about when it happened. Live events without one
    show when they arrived.
    """
    if ev.timestamp:
        when = ev.timestamp
    elif ev.source == "file":
        when = "(no time)"
    else:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev.received_at))
    dev = f"GPU {ev.device_index}" if ev.device_index is not None else "GPU ?"
    proc = ""
    if ev.pid is not None or ev.process:
        proc = f" pid={ev.pid if ev.pid is not None else '?'} ({ev.process or '?'})"
    phase = f" during {ev.phase}" if ev.phase else ""
    return (
        f"{when}  {ev.pci or '-'}  {dev}  Xid {ev.xid}: {ev.name} [{ev.severity}]{proc}{phase}"
        f" -> {ev.action}"
    )

"""The Xid parser and catalog on real kernel-log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotreload.gpu.kernel_log import kmsg_record_lines
from hotreload.gpu.nvml import normalize_bus_id
from hotreload.gpu.xid import (
    SEVERITIES,
    catalog_codes,
    event_to_json,
    lookup,
    parse_line,
    parse_lines,
)

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "xid_lines.txt"
if not FIXTURES.exists():  # the repo may sit elsewhere than next to shared/
    FIXTURES = Path("/work/shared/fixtures/xid_lines.txt")

# Expected (xid, pci, pid, process, timestamp) for each line of the shared fixture, in order.
FIXTURE_EXPECTED = [
    (32, "0000:01:00", None, None, "24128.828315"),
    (31, "0000:01:00", None, None, None),
    (31, "0000:00:06", 2708, None, None),
    (31, "0000:08:00", 169800, "chrome", None),
    (31, "0000:c1:00", 12890, None, "Nov 29 11:28:11"),
    (13, "0000:cb:00", None, None, "Fri Aug 30 11:43:09 2024"),
    (109, "0000:cb:00", 1797828, "pt_main_thread", "Fri Aug 30 11:43:14 2024"),
    (154, "0000:3e:00", None, None, "Mon May  4 14:09:23 2026"),
    (62, "0000:01:00", None, None, "Jun 12 16:12:04"),
    (45, "0000:dc:00", 1818990, "python3", None),
    (149, "0000:00:00", None, None, None),
    (48, "0000:07:00", None, None, "Dec  2 11:38:47"),
    (79, "0000:05:00", 1173, None, "Jan 16 14:04:39"),
    (79, "0000:44:00", None, None, None),
    (45, "0000:01:00", 12542, "VLLM::Worker", "Mar 27 17:40:36"),
    (119, "0000:9b:00", 2024380, "nvidia-smi", "Sun Feb 23 16:24:18 2025"),
    (63, "0000:10:1c", 1896, None, None),
]


def _fixture_lines() -> list[str]:
    return [ln for ln in FIXTURES.read_text().splitlines() if ln.strip()]


def test_every_fixture_line_parses_with_its_fields() -> None:
    lines = _fixture_lines()
    assert len(lines) == len(FIXTURE_EXPECTED)
    for line, (xid, pci, pid, process, ts) in zip(lines, FIXTURE_EXPECTED, strict=True):
        ev = parse_line(line)
        assert ev is not None, line
        assert (ev.xid, ev.pci, ev.pid, ev.process, ev.timestamp) == (xid, pci, pid, process, ts)
        assert ev.bus == normalize_bus_id(pci)
        assert ev.known and ev.severity in SEVERITIES and ev.action


def test_fixture_bodies_keep_the_rest_of_the_line() -> None:
    lines = _fixture_lines()
    assert parse_line(lines[0]).text == "Channel ID 00000000 intr 00004000"
    # pid='<unknown>' and name=<unknown> are read as "no pid / no process", not text.
    assert parse_line(lines[5]).text.startswith("Graphics SM Warp Exception on (GPC 7, TPC 7")
    assert parse_line(lines[13]).text == "GPU has fallen off the bus"
    assert parse_line(lines[9]).text == "Ch 00000001 caused by previous Xid 149"


# (line, xid, pci, pid, process, timestamp, text)
OWN_LINES = [
    # NVIDIA's documented form (docs.nvidia.com/deploy/xid-errors, "NVRM: Xid" grep advice).
    (
        "NVRM: Xid (PCI:0000:65:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        79,
        "0000:65:00",
        1234,
        "python",
        None,
        "GPU has fallen off the bus.",
    ),
    # Legacy DDDD:BB:DD bus id without "PCI:" (older drivers).
    (
        "NVRM: Xid (0000:03:00): 13, 0001 00000000 0000a097 00001b0c 00000004 00000000",
        13,
        "0000:03:00",
        None,
        None,
        None,
        "0001 00000000 0000a097 00001b0c 00000004 00000000",
    ),
    # Very old drivers printed only BB:DD.
    ("NVRM: Xid (02:00): 8, Channel 00000001", 8, "02:00", None, None, None, "Channel 00000001"),
    # Bus-less form seen in some reports.
    (
        "NVRM: Xid 79, GPU has fallen off the bus.",
        79,
        None,
        None,
        None,
        None,
        "GPU has fallen off the bus.",
    ),
    # journalctl -o short-iso with host name.
    (
        "2024-03-05T10:11:12+0100 gpu-node kernel: NVRM: Xid (PCI:0000:3b:00): 94, pid=77, "
        "name=python3.11, Contained: SM (0x1). RST: No, D-RST: No",
        94,
        "0000:3b:00",
        77,
        "python3.11",
        "2024-03-05T10:11:12+0100",
        "Contained: SM (0x1). RST: No, D-RST: No",
    ),
    # dmesg --decode --time-format iso (comma fraction).
    (
        "kern  :warn  : 2025-01-02T03:04:05,678901+00:00 NVRM: Xid (PCI:0000:17:00): 31, "
        "pid=4242, name=torchrun, Ch 00000010",
        31,
        "0000:17:00",
        4242,
        "torchrun",
        "2025-01-02T03:04:05,678901+00:00",
        "Ch 00000010",
    ),
    # journald in a German locale, no host name, precise time.
    (
        "Mär 27 17:40:36.123456 kernel: NVRM: Xid (PCI:0000:01:00): 43, pid=9, name=a.out, Ch 1",
        43,
        "0000:01:00",
        9,
        "a.out",
        "Mär 27 17:40:36.123456",
        "Ch 1",
    ),
    # journald in a Japanese locale.
    (
        "3月 16 14:04:39 ホスト kernel: NVRM: Xid (PCI:0000:01:00): 69, pid=5, Class Error",
        69,
        "0000:01:00",
        5,
        None,
        "3月 16 14:04:39",
        "Class Error",
    ),
    # Remote syslog: priority tag, then a forwarding host prefix.
    (
        "node017: <4>Jan  6 01:02:03 node017 kernel: [ 12.5] NVRM: Xid (PCI:0000:81:00): 48, "
        "pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
        48,
        "0000:81:00",
        None,
        None,
        "Jan  6 01:02:03",
        "An uncorrectable double bit error",
    ),
    # Redacted bus id (support bundles scrub them).
    (
        "NVRM: Xid (PCI:XXXX:XX:XX): 119, pid=1, name=nvidia-smi, Timeout after 6s",
        119,
        "XXXX:XX:XX",
        1,
        "nvidia-smi",
        None,
        "Timeout after 6s",
    ),
    # Process names with punctuation.
    (
        "NVRM: Xid (PCI:0000:01:00): 13, pid=31337, name=ray::IDLE-worker.1, Graphics Exception",
        13,
        "0000:01:00",
        31337,
        "ray::IDLE-worker.1",
        None,
        "Graphics Exception",
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 31, pid=8, name=kworker/u16:3, Ch 0000000a",
        31,
        "0000:01:00",
        8,
        "kworker/u16:3",
        None,
        "Ch 0000000a",
    ),
    # Truncated after the code.
    ("[ 5.1] NVRM: Xid (PCI:0000:01:00): 62", 62, "0000:01:00", None, None, "5.1", ""),
    # Unknown code: kept, shown as unknown.
    (
        "NVRM: Xid (PCI:0000:01:00): 999, pid=1, something new",
        999,
        "0000:01:00",
        1,
        None,
        None,
        "something new",
    ),
    # CRLF from a log copied off Windows.
    ("NVRM: Xid (PCI:0000:01:00): 8, idle\r\n", 8, "0000:01:00", None, None, None, "idle"),
    # NVLink on a multi-domain machine (leptonai/gpud#1174): PCI domain 0019, no pid.
    (
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)",
        149,
        "0019:01:00",
        None,
        None,
        None,
        "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)",
    ),
    # A process name with a space, from a `name=` the driver does not quote.
    (
        "NVRM: Xid (PCI:0000:0a:00): 31, pid=13332, name=cuda plot, Ch 00000010, intr 00000000",
        31,
        "0000:0a:00",
        13332,
        "cuda plot",
        None,
        "Ch 00000010, intr 00000000",
    ),
]


@pytest.mark.parametrize(("line", "xid", "pci", "pid", "process", "ts", "text"), OWN_LINES)
def test_log_forms(
    line: str, xid: int, pci: str | None, pid: int | None, process: str | None,
    ts: str | None, text: str,
) -> None:  # fmt: skip
    ev = parse_line(line)
    assert ev is not None
    assert (ev.xid, ev.pci, ev.pid, ev.process, ev.timestamp, ev.text) == (
        xid, pci, pid, process, ts, text,
    )  # fmt: skip


# The driver's multi-line report (NVIDIA/NVSentinel#155, leptonai/gpud#1209) as dmesg,
# journalctl and a /dev/kmsg record give it: the bus id and time are on the first line only.
MULTI_LINE_FALLEN = {
    "dmesg": [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    ],
    "journalctl": [
        "Feb 14 05:03:41 gpu-1 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
        "Feb 14 05:03:41 gpu-1 kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "Feb 14 05:03:41 gpu-1 kernel: NVRM: fallen off the bus and is not responding to commands.",
    ],
    "kmsg": kmsg_record_lines(
        rb"4,812,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) "
        rb"installed in this system has\x0aNVRM: fallen off the bus and is not responding "
        rb"to commands."
    ),
}
MULTI_LINE_TIME = {"dmesg": "1843.308145", "journalctl": "Feb 14 05:03:41", "kmsg": "1843.308145"}


@pytest.mark.parametrize("form", sorted(MULTI_LINE_FALLEN))
def test_the_drivers_multi_line_fallen_off_report_keeps_its_gpu(form: str) -> None:
    (ev,) = parse_lines(["noise", *MULTI_LINE_FALLEN[form], "more noise"])
    assert (ev.xid, ev.inferred, ev.pci, ev.bus) == (79, True, "0000:b3:00.0", (0, 0xB3, 0))
    assert ev.timestamp == MULTI_LINE_TIME[form]
    assert ev.text == "fallen off the bus and is not responding to commands."


def test_a_gpu_head_line_only_reaches_its_own_report() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "unrelated 1",
        "unrelated 2",
        "unrelated 3",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    (ev,) = parse_lines(lines)
    assert (ev.xid, ev.pci) == (79, None)  # too far away to be the same report


def test_kmsg_records_are_unescaped() -> None:
    record = rb"4,9,2000000,-;NVRM: Xid (PCI:0000:01:00): 31, pid=7, name=caf\xc3\xa9, Ch 1"
    (line,) = kmsg_record_lines(record)
    ev = parse_line(line)
    assert ev is not None and (ev.process, ev.timestamp, ev.text) == ("café", "2.000000", "Ch 1")


def test_redacted_bus_has_no_normalised_id() -> None:
    ev = parse_line("NVRM: Xid (PCI:XXXX:XX:XX): 119, x")
    assert ev is not None and ev.pci == "XXXX:XX:XX" and ev.bus is None


@pytest.mark.parametrize(
    ("line", "pci", "bus"),
    [
        ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "0000:3b:00.0", (0, 0x3B, 0)),
        ("NVRM: GPU at PCI:0000:01:00: GPU has fallen off the bus.", "0000:01:00", (0, 1, 0)),
        ("[ 9.9] NVRM: fallen off the bus and is not responding to commands.", None, None),
    ],
)
def test_xidless_fallen_off_the_bus_counts_as_79(
    line: str, pci: str | None, bus: tuple[int, int, int] | None
) -> None:
    ev = parse_line(line)
    assert ev is not None
    assert (ev.xid, ev.pci, ev.bus, ev.inferred) == (79, pci, bus, True)
    assert "power-cycle" in ev.action.lower()


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 47 egress PRIV error",
        "[  10.0] nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 30 LTSSM Fault",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:01:00: GPU-2f3c0000-1111-2222-3333-444455556666",
        "NVRM: Xid (PCI:0000:01",  # cut before the code: nothing to report
        "python: Xid 13 mentioned in an application log without NVRM",
        "",
    ],
)
def test_not_gpu_xids(line: str) -> None:
    assert parse_line(line) is None


def test_xid_154_action_is_the_drivers_verdict() -> None:
    ev = parse_line(
        "NVRM: Xid (PCI:0000:3e:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required)"
    )
    assert ev is not None and ev.action == "Driver asks: Node Reboot Required."


REQUIRED = [8, 13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
            109, 119, 120, 136, 140, 143, 144, 145, 149, 154]  # fmt: skip


def test_catalog_covers_the_required_codes() -> None:
    missing = sorted(set(REQUIRED) - set(catalog_codes()))
    assert not missing
    for code in catalog_codes():
        info = lookup(code)
        assert info.known and info.name and info.action and info.severity in SEVERITIES


@pytest.mark.parametrize(
    ("code", "severity"),
    [(13, "application"), (31, "application"), (94, "application"), (62, "driver"),
     (119, "driver"), (48, "hardware"), (79, "hardware"), (95, "hardware"),
     (63, "informational"), (92, "informational"), (154, "informational")],
)  # fmt: skip
def test_catalog_classes(code: int, severity: str) -> None:
    assert lookup(code).severity == severity


def test_unknown_code_is_shown_not_dropped() -> None:
    info = lookup(4242)
    assert (info.known, info.severity) == (False, "unknown")
    assert "4242" in info.name


def test_json_form_has_the_documented_keys() -> None:
    ev = parse_line(_fixture_lines()[3])
    d = event_to_json(ev)
    assert {"xid", "pci", "pid", "process", "name", "severity", "action", "text"} <= set(d)
    assert (d["xid"], d["pci"], d["pid"], d["process"]) == (31, "0000:08:00", 169800, "chrome")


@pytest.mark.parametrize(
    ("text", "bus"),
    [
        ("00000000:01:00.0", (0, 1, 0)),
        ("PCI:0000:65:00", (0, 0x65, 0)),
        ("0001:C1:1f", (1, 0xC1, 0x1F)),
        ("3b:00", (0, 0x3B, 0)),
        ("XXXX:XX:XX", None),
        ("", None),
        (None, None),
    ],
)
def test_bus_ids_normalise_across_nvml_and_kernel_forms(
    text: str | None, bus: tuple[int, int, int] | None
) -> None:
    assert normalize_bus_id(text) == bus

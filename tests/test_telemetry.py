"""GPU telemetry in a running session, on this GPU-less machine: the panels' data sources
say why there is no GPU data, and Xid lines from the kernel log become events."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support import read_events, wait_until


def test_session_without_gpu_says_why_and_reports_xids(
    project: Path, serve, tmp_path: Path
) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    session = serve(project, "--no-tui", command="watch", env={"HOTRELOAD_KMSG_PATH": str(fifo)})
    assert "no GPU data: NVML library not found" in session.output
    assert "Xid sources: nvml off" in session.output and "kmsg on" in session.output
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        record = (
            "3,1234,%d,-;NVRM: Xid (PCI:0000:65:00): 79, pid=4242, name=python, "
            "GPU has fallen off the bus.\n"
        )
        os.write(fd, (record % int(time.monotonic() * 1e6)).encode())
        wait_until(
            lambda: any(e["kind"] == "xid" for e in read_events(project)), 20, what="an xid event"
        )
    finally:
        os.close(fd)
    (xid,) = [e for e in read_events(project) if e["kind"] == "xid"]
    assert (xid["xid"], xid["pci"], xid["pid"], xid["process"]) == (
        79,
        "0000:65:00",
        4242,
        "python",
    )
    assert xid["severity"] == "hardware" and "fallen off the bus" in xid["name"].lower()
    session.wait_for("Xid 79")

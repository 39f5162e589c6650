"""The socket ops a dashboard in another process drives a `hotreload watch` session with:
a real session, a real socket, a kernel log fed through a FIFO (this machine has no GPU)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from hotreload.client import AsyncClient, Client
from hotreload.errors import BadRequestError
from hotreload.gpu.readings import GpuSnapshot
from hotreload.gpu.xid_events import XidEvent
from hotreload.protocol.framing import Frame
from tests.scripted_source import gpu_scenario
from tests.support import ServeProcess

XID_RECORD = (
    "3,1234,%d,-;NVRM: Xid (PCI:0000:65:00): 79, pid=4242, name=python, "
    "GPU has fallen off the bus.\n"
)


def test_snapshot_and_xid_survive_the_json_round_trip() -> None:
    import json

    samples, _ = gpu_scenario(steps=3)
    snap = samples[-1].gpu
    assert snap is not None and snap.devices and snap.devices[0].processes
    assert GpuSnapshot.from_dict(json.loads(json.dumps(asdict(snap)))) == snap
    xid = samples[-1].xids[0]
    assert XidEvent.from_dict(json.loads(json.dumps(asdict(xid)))) == xid


def test_events_replay_then_stream_and_the_dashboard_sample(
    project: Path, serve: ServeProcess.Factory, tmp_path: Path
) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    watch = serve(project, "--no-tui", command="watch", env={"HOTRELOAD_KMSG_PATH": str(fifo)})
    watch.wait_for("watching")

    async def main() -> None:
        frames: list[Frame | None] = []
        async with AsyncClient(project) as client:
            await client.subscribe({"op": "events"}, frames.append)
            loop = asyncio.get_running_loop()

            async def seen(pred, what: str) -> None:  # type: ignore[no-untyped-def]
                deadline = loop.time() + 30
                while not pred():
                    assert loop.time() < deadline, f"timed out waiting for {what}"
                    await asyncio.sleep(0.05)

            def kinds(replayed: bool) -> list[str]:
                return [
                    f.header["event"]["kind"]
                    for f in frames
                    if f is not None and bool(f.header.get("replayed")) == replayed
                ]

            # The bring-up, replayed to a late subscriber.
            await seen(lambda: "ready" in kinds(True), "the replayed bring-up")
            assert "session_started" in kinds(True)

            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, (XID_RECORD % int(time.monotonic() * 1e6)).encode())
                await seen(lambda: "xid" in kinds(False), "the xid event, live")
            finally:
                os.close(fd)

            await client.call({"op": "reload", "model": "mlp", "trigger": "key", "force": True})
            await seen(lambda: "reload_done" in kinds(False), "reload_done, live")

            r = (await client.call({"op": "dashboard"})).header
            assert r["start_state"] == "started" and r["start_error"] is None
            assert r["reset_mode"] == "never" and r["config"] == str(project)
            (m,) = r["models"]
            assert (m["name"], m["state"], m["version"]) == ("mlp", "serving", 2)
            (outcome,) = r["reloads"]
            assert outcome["ok"] and outcome["trigger"] == "key" and "swap" in outcome["phases"]
            snap = GpuSnapshot.from_dict(r["gpu"])
            assert not snap.available and "NVML library not found" in (snap.reason or "")
            (xid,) = [XidEvent.from_dict(x) for x in r["xids"]]
            assert (xid.xid, xid.bus, xid.pid) == (79, (0, 0x65, 0), 4242)
            assert {s["name"] for s in r["xid_sources"]} >= {"nvml", "kmsg"}
            assert r["paused"] is False
            form, signature = r["inputs"]["mlp"]
            assert form == "single" and signature[0]["dtype"] == "float32"

        # The client went away: the session dropped the subscription and serves on.
        assert frames[-1] is None

    asyncio.run(asyncio.wait_for(main(), 90))
    with Client(project, timeout_s=10) as client:
        assert client.status()["models"][0]["state"] == "serving"


def test_pause_rewarm_and_reset_ops(project: Path, serve: ServeProcess.Factory) -> None:
    watch = serve(project, "--no-tui", command="watch")
    watch.wait_for("watching")
    with Client(project, timeout_s=30) as client:
        assert client.call({"op": "pause", "paused": True}).header["paused"] is True
        assert client.call({"op": "dashboard"}).header["paused"] is True
        watch.wait_for("watcher paused")
        assert client.call({"op": "pause", "paused": False}).header["paused"] is False
        watch.wait_for("watcher resumed")
        with pytest.raises(BadRequestError, match="'paused' must be true or false"):
            client.call({"op": "pause", "paused": "yes"})

        r = client.call({"op": "rewarm", "model": "mlp"}).header
        assert r["passes_ms"] and r["warm_s"] >= 0
        with pytest.raises(BadRequestError, match="unknown model 'nope'"):
            client.call({"op": "rewarm", "model": "nope"})

        d = client.call({"op": "reset_check", "index": 0}).header["decision"]
        assert d["allowed"] is False and d["reason"]
        r = client.call({"op": "reset_gpu", "index": 0}).header["result"]
        assert r["ok"] is False and "refused" in r["message"]
        with pytest.raises(BadRequestError, match="GPU index"):
            client.call({"op": "reset_check", "index": -1})
        assert client.status()["models"][0]["state"] == "serving"


def test_a_serve_session_refuses_dashboard_ops_by_name(
    project: Path, serve: ServeProcess.Factory
) -> None:
    serve(project)
    with (
        Client(project, timeout_s=10) as client,
        pytest.raises(BadRequestError, match="unknown op 'dashboard'"),
    ):
        client.call({"op": "dashboard"})

"""A scripted `DashboardSource`: fixed samples on a fixed clock, no session behind it.

Snapshot tests and the docs picture (docs/assets/dashboard.svg) use it with the app factory
the CLI uses.
`sample()` returns each scripted sample once, then waits until `stop()`: a screenshot sees
exactly the script, however fast or slow the machine is.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from hotreload.engine.event_kinds import BaseEvent
from hotreload.engine.events import build
from hotreload.engine.model import ReloadOutcome
from hotreload.gpu.readings import GpuDevice, GpuProcess, GpuSnapshot
from hotreload.gpu.reset import ResetDecision, ResetResult
from hotreload.gpu.xid_events import XidEvent, lookup
from hotreload.tui.render import PACKAGE_DIR
from hotreload.tui.source import Sample
from hotreload.tui.state import DashboardState

MIB = 2**20
GIB = 2**30
#: 2026-01-02 09:30:00 UTC: the scripted "now".
T0 = 1767346200.0


class FixedClock:
    """A clock that never moves, printing times in UTC (snapshots must not depend on TZ)."""

    def __init__(self, now: float = T0) -> None:
        self._now = now

    def now(self) -> float:
        return self._now

    def hms(self, ts: float) -> str:
        return time.strftime("%H:%M:%S", time.gmtime(ts))


class ScriptedSource:
    def __init__(
        self,
        samples: Sequence[Sample],
        *,
        title: str = "examples/mlp/hotreload.toml",
        reset_mode: str = "never",
        decision: ResetDecision | None = None,
        clock: FixedClock | None = None,
    ) -> None:
        self.clock = clock or FixedClock()
        self.title = title
        self.reset_mode = reset_mode
        self.samples = list(samples)
        self.decision = decision or ResetDecision(False, "GPU reset is off (scripted)")
        self.subscribers: list[Callable[[BaseEvent, bool], None]] = []
        #: What the app asked for, in order (keys pressed show up here).
        self.calls: list[tuple[str, Any]] = []
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        self.calls.append(("start", None))

    async def stop(self) -> None:
        self.calls.append(("stop", None))
        self._stopped.set()

    async def sample(self) -> Sample:
        if self.samples:
            return self.samples.pop(0)
        await self._stopped.wait()
        raise RuntimeError("the script is over")

    def subscribe(self, fn: Callable[[BaseEvent, bool], None]) -> Callable[[], None]:
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn)

    def emit(self, kind: str, **fields: Any) -> None:
        """Play an engine event to the app (checked and shaped as the engine's are)."""
        event = build(kind, fields, ts=self.clock.now())
        for fn in list(self.subscribers):
            fn(event, False)

    async def reload(self, model: str | None) -> list[ReloadOutcome]:
        self.calls.append(("reload", model))
        return []

    async def rollback(self, model: str) -> list[ReloadOutcome]:
        self.calls.append(("rollback", model))
        return []

    async def rewarm(self, model: str) -> dict[str, Any]:
        self.calls.append(("rewarm", model))
        return {"warm_s": 0.01, "passes_ms": [1.0, 1.0, 1.0]}

    async def set_paused(self, paused: bool) -> None:
        self.calls.append(("paused", paused))

    def check_reset(self, index: int) -> ResetDecision:
        return self.decision

    def reset(self, index: int) -> ResetResult:
        return ResetResult(False, "scripted: nothing reset")

    def load_targets(self) -> tuple[str, dict[str, tuple[str, list[dict[str, Any]]]]]:
        return "", {}


# ---------------------------------------------------------------------- scenarios


def _model(
    name: str,
    version: int,
    *,
    device: str,
    t: float,
    policy: str = "auto",
    strategy: str = "inplace",
    state: str = "serving",
    leak_mib: float = 0.0,
) -> dict[str, Any]:
    """A `Session.status()` model entry at scripted time step `t` (0..1)."""
    depth = int(max(0.0, 40 * math.sin(t * math.pi * 3)) if t > 0.5 else 2 * (t * 10 % 2))
    worker: dict[str, Any] = {"rss_bytes": int((410 + leak_mib) * MIB)}
    if device.startswith("cuda"):
        worker["allocator"] = {
            "allocated_bytes": int((512 + leak_mib) * MIB),
            "reserved_bytes": int((640 + leak_mib) * MIB),
            "peak_bytes": int(700 * MIB),
        }
    p99 = 3.1 + 2.5 * max(0.0, math.sin(t * math.pi * 3)) * (t > 0.5) + 0.3 * math.sin(t * 40)
    return {
        "name": name,
        "state": state,
        "version": version,
        "device": device,
        "policy": policy,
        "strategy": strategy,
        "pid": 4100 + len(name),
        "restarts": 0,
        "last_error": None,
        "queue_depth": depth,
        "queue_limit": 256,
        "inflight": min(depth, 4),
        "requests": {
            "ok": 48213,
            "rejected": 12,
            "timed_out": 0,
            "failed": 0,
            "retried": 0,
            "bad_request": 0,
        },
        "latency": {
            "count": 17890,
            "p50_ms": 1.21,
            "p95_ms": 2.04,
            "p99_ms": round(p99, 2),
            "max_ms": 9.87,
        },
        "worker": worker,
    }


def _reloads() -> tuple[ReloadOutcome, ...]:
    phases_ok = {
        "load": 0.121,
        "warm": 0.031,
        "smoke": 0.002,
        "gate": 0.0,
        "drain": 0.0011,
        "sync": 0.0004,
        "swap": 0.0003,
        "resume": 0.0,
        "release": 0.0032,
    }
    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{PACKAGE_DIR}worker/loader.py", line 212, in build_version\n'
        '  File "model.py", line 31\n'
        "    def build(:\n"
        "              ^\n"
        "SyntaxError: invalid syntax"
    )
    return (
        ReloadOutcome(
            "mlp", True, 2, "file", "availability", "inplace", phases=phases_ok,
            total_s=0.162, detail=["model.py"], started_at=T0 - 300,
        ),
        ReloadOutcome(
            "mlp", False, 2, "file", "availability", "inplace", phase="load",
            error="SyntaxError: invalid syntax (model.py, line 31)", traceback=tb,
            phases={"load": 0.012}, total_s=0.015, detail=["model.py"], started_at=T0 - 200,
        ),
        ReloadOutcome(
            "encoder", True, 2, "command", "resource", "respawn",
            phases={"gate": 0.0, "drain": 0.004, "sync": 0.002, "release": 0.05, "spawn": 1.9,
                    "load": 0.8, "warm": 0.2, "smoke": 0.01, "swap": 0.001, "resume": 0.0},
            total_s=2.97, started_at=T0 - 120,
        ),
        ReloadOutcome(
            "mlp", True, 3, "key", "availability", "inplace", phases=phases_ok,
            total_s=0.158, started_at=T0 - 30,
        ),
    )  # fmt: skip


def _xid(code: int, when: float, *, pid: int | None, phase: str | None) -> XidEvent:
    info = lookup(code)
    return XidEvent(
        xid=code, pci="0000:65:00", bus=(0, 0x65, 0), device_index=0, pid=pid,
        process="python" if pid else None, name=info.name, severity=info.severity,
        action=info.action, text="", timestamp=None, received_at=when, source="kmsg",
        phase=phase,
    )  # fmt: skip


def gpu_scenario(steps: int = 240) -> tuple[list[Sample], DashboardState]:
    """Two models on one GPU, a failed and three good reloads, two Xid events (one critical).
    Returns the live sample(s) and a state holding the `steps` samples before them."""
    gpu = GpuSnapshot(
        taken_at=T0, available=True, reason=None, driver_version="570.86.15",
        cuda_driver_version="12.8",
        devices=(
            GpuDevice(
                index=0, name="NVIDIA H200", uuid="GPU-0", pci_bus_id="00000000:65:00.0",
                memory_total=int(139.8 * GIB), memory_used=int(21.3 * GIB),
                memory_reserved=None, utilization_pct=37, temperature_c=51, power_w=212.0,
                processes=(
                    GpuProcess(4103, int(1.4 * GIB), True),
                    GpuProcess(4107, int(2.1 * GIB), True),
                    GpuProcess(3999, int(17.3 * GIB), False),
                ),
                recovery_action="none",
            ),
        ),
    )  # fmt: skip
    xids = (
        _xid(13, T0 - 250, pid=4103, phase="mlp:warm"),
        _xid(48, T0 - 40, pid=None, phase=None),
    )
    sources = ({"name": "nvml", "active": True, "reason": None},
               {"name": "kmsg", "active": True, "reason": None})  # fmt: skip

    def at(i: int, version: int, leak: float) -> Sample:
        t = i / steps
        return Sample(
            taken_at=T0 - (steps - i) * 0.5,
            models=(
                _model("mlp", version, device="cuda:0", t=t, leak_mib=leak),
                _model(
                    "encoder", 2, device="cuda:0", t=t / 2, policy="resource", strategy="respawn"
                ),
            ),
            reloads=_reloads(),
            gpu=gpu,
            xids=xids,
            xid_sources=sources,
            http_url="http://127.0.0.1:8000",
            socket=".hotreload/hotreload.sock",
        )

    return _play(at, steps)


def cpu_scenario(steps: int = 240) -> tuple[list[Sample], DashboardState]:
    """The example MLP on a machine without an NVIDIA GPU (the CI kind)."""
    gpu = GpuSnapshot(
        taken_at=T0, available=False,
        reason="NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed",
        driver_version=None, cuda_driver_version=None, devices=(),
        reason_kind="library_not_found",
    )  # fmt: skip
    sources = (
        {"name": "nvml", "active": False, "reason": "NVML library not found"},
        {"name": "kmsg", "active": True, "reason": None},
    )
    reloads = tuple(o for o in _reloads() if o.model == "mlp")

    def at(i: int, version: int, leak: float) -> Sample:
        return Sample(
            taken_at=T0 - (steps - i) * 0.5,
            models=(_model("mlp", version, device="cpu", t=i / steps, leak_mib=leak),),
            reloads=reloads,
            gpu=gpu,
            xids=(),
            xid_sources=sources,
            socket=".hotreload/hotreload.sock",
        )

    return _play(at, steps)


def _play(
    at: Callable[[int, int, float], Sample], steps: int
) -> tuple[list[Sample], DashboardState]:
    state = DashboardState()
    for i in range(steps):
        # v1, then two reloads; memory grows a little with each: the leak line climbs.
        third = 3 * i // steps
        state.update(at(i, 1 + third, (0.0, 3.0, 12.5)[third]))
    return [at(steps, 3, 12.5)], state


def save_screenshot(path: str, size: tuple[int, int] = (120, 36)) -> None:
    """Write the scripted one-GPU screen as an SVG (the picture of docs/dashboard.md)."""
    from hotreload.tui.app import build_app

    samples, state = gpu_scenario()
    app = build_app(ScriptedSource(samples), state=state)

    async def shoot() -> str:
        async with app.run_test(size=size) as pilot:
            await app.wait_for_first_sample(10)
            await pilot.pause()
            return app.export_screenshot(title="hotreload watch")

    svg = asyncio.run(shoot())
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg)


if __name__ == "__main__":  # python -m tests.scripted_source docs/assets/dashboard.svg
    import sys

    save_screenshot(sys.argv[1] if len(sys.argv) > 1 else "dashboard.svg")

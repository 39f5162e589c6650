"""Shared pieces of the benchmarks: closed-loop load drivers and figure formatting.

Benchmarks print figures and ratios measured side by side in one run; they are not tests.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


@dataclass
class LoadResult:
    label: str
    clients: int
    sent: int
    ok: int
    failed: int
    seconds: float
    latencies_ms: list[float]
    #: (send time since start, latency ms, version) per request, for window analyses.
    samples: list[tuple[float, float, int]]
    #: Wall-clock instant (time.time()) the sample times are relative to.
    origin: float = 0.0

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)

    def row(self) -> str:
        return (
            f"{self.label:<34} {self.clients:>4} {self.p50:>9.3f} {self.p99:>9.3f} "
            f"{self.rps:>10.0f} {self.failed:>7}"
        )


HEADER = f"{'path':<34} {'cli':>4} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>10} {'failed':>7}"


async def _closed_loop(
    socket_path: str,
    model: str,
    clients: int,
    duration_s: float,
    t_start: float,
    width: int,
    rows: int = 1,
) -> tuple[list[tuple[float, float, int]], int, int]:
    from hotreload.client import AsyncClient

    samples: list[tuple[float, float, int]] = []
    failures = 0
    sent = 0
    x = np.zeros((rows, width), dtype=np.float32)
    # Start at a shared wall-clock instant so several processes measure the same window.
    await asyncio.sleep(max(0.0, t_start - time.time()))
    end = time.perf_counter() + duration_s
    t0_wall = time.time()

    async def one() -> None:
        nonlocal failures, sent
        client = AsyncClient(socket_path=socket_path)
        try:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                sent += 1
                try:
                    r = await client.infer(model, x, timeout_s=30)
                except Exception:
                    failures += 1
                    await asyncio.sleep(0.001)
                    continue
                t1 = time.perf_counter()
                samples.append((t0_wall + (t0 - (end - duration_s)), (t1 - t0) * 1000, r.version))
        finally:
            await client.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return samples, failures, sent


def _proc_main(args: tuple[Any, ...], out: Any) -> None:
    out.send(asyncio.run(_closed_loop(*args)))
    out.close()


def drive(
    socket_path: str,
    model: str,
    clients: int,
    duration_s: float,
    *,
    procs: int = 1,
    width: int = 64,
    rows: int = 1,
    label: str = "",
) -> LoadResult:
    """`clients` closed-loop clients spread over `procs` processes for `duration_s`."""
    ctx = mp.get_context("spawn")
    t_start = time.time() + 1.5  # time for the processes to start
    pipes, workers = [], []
    for i in range(procs):
        share = clients // procs + (1 if i < clients % procs else 0)
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_proc_main,
            args=((socket_path, model, share, duration_s, t_start, width, rows), child),
        )
        p.start()
        pipes.append(parent)
        workers.append(p)
    samples: list[tuple[float, float, int]] = []
    failed = sent = 0
    for parent, p in zip(pipes, workers, strict=True):
        s, f, n = parent.recv()
        samples += s
        failed += f
        sent += n
        p.join(30)
    samples.sort()
    rel = [(t - t_start, lat, v) for t, lat, v in samples]
    return LoadResult(
        label or model,
        clients,
        sent,
        len(samples),
        failed,
        duration_s,
        [s[1] for s in rel],
        rel,
        t_start,
    )


class Server:
    """A `hotreload serve` (or any command) subprocess, stopped with SIGINT."""

    def __init__(self, args: list[str], ready_text: str, cwd: Path, timeout_s: float = 120) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("server exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if ready_text in line:
                # Keep reading: a full pipe would block the server's next print (and with
                # it its event loop) after a few hundred reloads' worth of lines.
                threading.Thread(target=self._drain, daemon=True).start()
                return
        raise RuntimeError("server not ready:\n" + "".join(self.lines))

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def read_events(project: Path) -> list[dict[str, Any]]:
    """The session's `.hotreload/events.jsonl` in `project` (a line being written is skipped)."""
    path = project / ".hotreload" / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Wait for the KServe ready route of the example's `mlp` at `url`; exit if `proc` ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v2/models/mlp/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"not ready after {timeout} s")


def stop_server(proc: subprocess.Popen[bytes], wait_s: float = 30) -> None:
    """SIGINT, `wait_s` to end, then SIGKILL to its whole process group (its workers)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(10)

"""The exported example under Triton vs the same model under hotreload, side by side.

    .venv/bin/python benchmarks/triton_side_by_side.py [--clients 32 200] [--seconds 24]
        [--every 3] [--servers hotreload triton-poll triton-explicit]

Each run starts a fresh server on a fresh copy of the example MLP: `hotreload watch --http`,
or the nvidia-pytriton wheel's tritonserver on `hotreload export triton`'s repository
(`--model-control-mode=poll --repository-poll-secs=1`, or `explicit` with a repository
load request after each edit: POST /v2/repository/models/mlp/load, what tritonclient's
`load_model` sends over HTTP; the gRPC call is the same operation, and grpcio is not
installed here). The same closed-loop KServe JSON client (aiohttp, 2 processes) drives N
clients for `--seconds`; every `--every` s the model's SCALE is edited in the file the
server reads (the project's model.py, or the export's 1/code/model.py). Each server runs
once without edits (the baseline) and once with them.

Reported per run: sent, answers per second, failed, p50/p99; p99 in reload windows
(requests overlapping [edit, first new answer + 0.5 s]) against the no-reload run's p99;
write -> first new answer (the first reply whose value shows the new SCALE; Triton keeps
version "1"); the servers' CPU-seconds (all their processes) per 1,000 answered requests,
and of them the front process's (hotreload's engine, tritonserver; the rest is the
model's process: the worker, the python backend's stub). Figures, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from common import REPO, percentile, stop_server, wait_ready

from hotreload.export.local_triton import ensure_python_env, find_local_triton

BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
).encode()


async def _closed_loop(
    url: str, clients: int, seconds: float, t_start: float
) -> tuple[list[tuple[float, float, float]], int, int]:
    """(send wall time, latency ms, output[0]) per answer; failures; sent."""
    import aiohttp

    samples: list[tuple[float, float, float]] = []
    failed = sent = 0
    await asyncio.sleep(max(0.0, t_start - time.time()))
    end = time.time() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=60)
    ) as http:

        async def one() -> None:
            nonlocal failed, sent
            while time.time() < end:
                t_wall, t0 = time.time(), time.perf_counter()
                sent += 1
                try:
                    async with http.post(url + "/v2/models/mlp/infer", data=BODY) as r:
                        doc = await r.json(content_type=None)
                        if r.status != 200:
                            raise RuntimeError(doc)
                    value = float(doc["outputs"][0]["data"][0])
                except Exception:
                    failed += 1
                    await asyncio.sleep(0.001)
                    continue
                samples.append((t_wall, (time.perf_counter() - t0) * 1000, value))

        await asyncio.gather(*(one() for _ in range(clients)))
    return samples, failed, sent


def _client_proc(args: tuple[Any, ...], out: Any) -> None:
    out.send(asyncio.run(_closed_loop(*args)))
    out.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _set_scale(model_py: Path, scale: float) -> None:
    text = model_py.read_text()
    start = text.index("SCALE = ")
    stop = text.index("\n", start)
    model_py.write_text(text[:start] + f"SCALE = {scale:.3f}" + text[stop:])


@dataclass
class Run:
    server: str
    clients: int
    reloads: bool
    seconds: float
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    failed: int = 0
    sent: int = 0
    edits: list[tuple[float, float]] = field(default_factory=list)  # (time, scale)
    cpu_s: float = 0.0
    #: Of `cpu_s`, the front process's own (the HTTP server: engine, tritonserver).
    front_cpu_s: float = 0.0


def _start(server: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The server process, its URL and the model file a reload edits."""
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj, ignore=shutil.ignore_patterns(".hotreload"))
    port = _free_port()
    log = (tmp / "server.log").open("w")
    if server == "hotreload":
        cmd = [sys.executable, "-m", "hotreload", "watch", "--no-tui", "--config"]
        cmd += [str(proj / "hotreload.toml"), "--http", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=proj, start_new_session=True
        )
        return proc, f"http://127.0.0.1:{port}", proj / "model.py"
    repo = tmp / "repo"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hotreload",
            "export",
            "triton",
            str(repo),
            "--config",
            str(proj / "hotreload.toml"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    triton = find_local_triton()
    if isinstance(triton, str):
        raise SystemExit(triton)
    mode = (
        ("--model-control-mode=poll", "--repository-poll-secs=1")
        if server == "triton-poll"
        else ("--model-control-mode=explicit", "--load-model=mlp")
    )
    cmd = triton.command(
        repo,
        triton.backends(tmp / "backends"),
        http_port=port,
        grpc_port=_free_port(),
        metrics_port=_free_port(),
        extra=mode,
    )
    proc = subprocess.Popen(
        cmd,
        env=triton.env(ensure_python_env()),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}", repo / "mlp" / "1" / "code" / "model.py"


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of the server's process tree, ended children included (a reloaded Triton
    stub or a retired hotreload worker counts in its reaping parent's children_* times),
    and of the root process alone (its own user and system time)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    total = front = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
        if p is root:
            front = t.user + t.system
    return total, front


def run_once(server: str, clients: int, seconds: float, every: float, reloads: bool) -> Run:
    tmp = Path(tempfile.mkdtemp(prefix="hr-triton-bench-"))
    proc, url, model_py = _start(server, tmp)
    run = Run(server, clients, reloads, seconds)
    try:
        wait_ready(url, proc)
        time.sleep(1.0)  # past the first answers' lazy set-up
        ctx = mp.get_context("spawn")
        t_start = time.time() + 2.0
        pipes, workers = [], []
        for i in range(2):
            parent, child = ctx.Pipe(duplex=False)
            share = clients // 2 + (i < clients % 2)
            p = ctx.Process(target=_client_proc, args=((url, share, seconds, t_start), child))
            p.start()
            pipes.append(parent)
            workers.append(p)
        cpu0, front0 = _cpu_seconds(proc.pid)
        k = 0
        while reloads:
            at = t_start + every / 2 + k * every
            if at > t_start + seconds - 1.0:
                break
            time.sleep(max(0.0, at - time.time()))
            k += 1
            scale = 1.0 + k / 100
            run.edits.append((time.time(), scale))
            _set_scale(model_py, scale)
            if server == "triton-explicit":
                req = urllib.request.Request(
                    url + "/v2/repository/models/mlp/load", data=b"", method="POST"
                )
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
        time.sleep(max(0.0, t_start + seconds - time.time()))
        cpu1, front1 = _cpu_seconds(proc.pid)
        run.cpu_s, run.front_cpu_s = cpu1 - cpu0, front1 - front0
        for parent, p in zip(pipes, workers, strict=True):
            s, f, n = parent.recv()
            run.samples += s
            run.failed += f
            run.sent += n
            p.join(30)
    finally:
        stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    run.samples.sort()
    return run


def first_new_answers(run: Run) -> list[float | None]:
    """Per edit: seconds from the write to the first reply showing the new SCALE."""
    if not run.samples:
        return []
    base = run.samples[0][2]  # SCALE 1.0; each edit moves the answer by 1 %
    out: list[float | None] = []
    for at, scale in run.edits:
        hits = [
            t + lat / 1000
            for t, lat, v in run.samples
            if t >= at and abs(v - base * scale) <= 2e-3 * abs(base * scale)
        ]
        out.append(min(hits) - at if hits else None)
    return out


def report(run: Run, baseline: Run | None) -> None:
    lat = [s[1] for s in run.samples]
    ok = len(run.samples)
    line = (
        f"{run.server:<16} {run.clients:>4} {'edits' if run.reloads else 'none':<6} "
        f"{run.sent:>7} {ok / run.seconds:>6.0f} {run.failed:>6} {percentile(lat, 50):>8.2f} "
        f"{percentile(lat, 99):>8.2f}"
    )
    cpu = run.cpu_s / ok * 1000 if ok else float("nan")
    front = run.front_cpu_s / ok * 1000 if ok else float("nan")
    if run.reloads:
        firsts = first_new_answers(run)
        spans = [
            (at, at + (f if f is not None else 3.0) + 0.5)
            for (at, _), f in zip(run.edits, firsts, strict=True)
        ]
        inside = [
            lat_ms
            for t, lat_ms, _ in run.samples
            if any(a <= t + lat_ms / 1000 and t <= b for a, b in spans)
        ]
        p99_in = percentile(inside, 99)
        ratio = p99_in / percentile([s[1] for s in baseline.samples], 99) if baseline else 0
        seen = sorted(f for f in firsts if f is not None)
        med = f"{seen[len(seen) // 2]:.2f}" if seen else "never"
        worst = f"{seen[-1]:.2f}" if seen else "-"
        line += f" {p99_in:>9.2f} {ratio:>6.2f}x  {med:>6} / {worst:<6} {len(seen)}/{len(firsts)}"
    else:
        line += f" {'':>9} {'':>7}  {'':>15}"
    print(line + f" {cpu:>8.3f} {front:>8.3f}", flush=True)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs the `finally` that stops the server


def main() -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[32, 200])
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument(
        "--servers", nargs="+", default=["hotreload", "triton-poll", "triton-explicit"]
    )
    args = parser.parse_args()
    print(
        f"{'server':<16} {'cli':>4} {'reload':<6} {'sent':>7} {'ans/s':>6} {'failed':>6} "
        f"{'p50 ms':>8} "
        f"{'p99 ms':>8} {'p99 in rl':>9} {'vs no':>7}  {'new answer s':>15} "
        f"{'cpu-s/1k':>8} {'of front':>8}"
    )
    print(f"{'':<77} (median / worst, edits seen)")
    for clients in args.clients:
        for server in args.servers:
            baseline = run_once(server, clients, args.seconds, args.every, reloads=False)
            report(baseline, None)
            report(run_once(server, clients, args.seconds, args.every, reloads=True), baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())

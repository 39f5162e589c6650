"""HTTP reload benchmark: closed-loop KServe v2 clients on loopback while the example reloads.

    .venv/bin/python benchmarks/http_reload.py [--clients 32 200] [--seconds 24] [--every 3]
        [--strategy inplace respawn] [--build-pace 0 3] [--cpus auto off] [--control]
        [--repeat 3]
        [--trigger api|edit] [--server-cmd "hotreload watch ... --http 127.0.0.1:{port}"]

Each run starts a fresh session serving the example MLP over HTTP, drives N closed-loop
clients (tritonclient's wire format: binary input, binary output) spread over two client
processes, and edits `model.py` every `--every` seconds. With `--trigger api` (default) each
edit is followed by `POST /v2/repository/models/mlp/load` (what `tritonclient`'s
`load_model` sends); with `--trigger edit` only the file is written and the session's own
watcher must notice it (`hotreload watch --http`).

Reported per run: sent, ok, failed; p50/p99 overall, outside reloads (steady) and inside
reload windows (a request whose [send, reply] interval overlaps [edit, reload finished]);
and edit-to-first-new-version time (file write to the first reply computed by the new
version). `--control` adds a run that makes the same edits and one metadata request per
cycle but never reloads, measured over windows as long as the median reload window: the
share of the harness itself. `--repeat` interleaves rounds of every configuration and pools
them: p99 over a few hundred in-window requests moves by 0.1x between identical runs here.
Figures, not a pass/fail test.

Targets (issue 7), against a real Triton server measured on the same machine: 0 failed;
p99 in reload windows <= 1.1x steady; edit to first new-version answer <= 0.17 s plus the
model's own load and warm time (Triton's poll mode: 1.7-2.1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shlex
import shutil
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, Server, percentile, read_events

#: Run as `http_reload.py --serve-session CONFIG PORT`: a session with its HTTP endpoint,
#: for engines whose `hotreload serve` has no `--http` yet.
# ----------------------------------------------------------------------------- clients


def _request_body() -> tuple[bytes, dict[str, str]]:
    """One 1x64 FP32 input as tritonclient sends it: JSON header, then the raw bytes."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 256},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    x = bytes(256)  # zeros: float32 0.0
    return head + x, {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


async def _closed_loop(
    url: str, clients: int, duration_s: float, t_start: float, socket_path: str | None = None
) -> tuple[list[tuple[float, float, int]], list[float], int]:
    """HTTP clients on `url`, or with `socket_path` the Unix-socket client (for comparison)."""
    import aiohttp
    import numpy as np

    from hotreload.client import AsyncClient

    body, headers = _request_body()
    samples: list[tuple[float, float, int]] = []  # (send wall time, latency ms, version)
    failures: list[float] = []  # wall time of each failed request
    sent = 0
    await asyncio.sleep(max(0.0, t_start - time.time()))
    end = time.time() + duration_s
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def over_socket() -> None:
            nonlocal sent
            x = np.zeros((1, 64), np.float32)
            client = AsyncClient(socket_path=socket_path)
            try:
                while time.time() < end:
                    t_wall, t0 = time.time(), time.perf_counter()
                    sent += 1
                    try:
                        version = (await client.infer("mlp", x, timeout_s=60)).version
                    except Exception:
                        failures.append(t_wall)
                        await asyncio.sleep(0.001)
                        continue
                    samples.append((t_wall, (time.perf_counter() - t0) * 1000, version))
            finally:
                await client.close()

        async def one() -> None:
            nonlocal sent
            if socket_path is not None:
                return await over_socket()
            while time.time() < end:
                t_wall, t0 = time.time(), time.perf_counter()
                sent += 1
                try:
                    async with http.post(
                        url + "/v2/models/mlp/infer", data=body, headers=headers
                    ) as r:
                        data = await r.read()
                        if r.status != 200:
                            raise RuntimeError(data[:200])
                        n = int(r.headers["Inference-Header-Content-Length"])
                        version = int(json.loads(data[:n])["model_version"])
                except Exception:
                    failures.append(t_wall)
                    await asyncio.sleep(0.001)
                    continue
                samples.append((t_wall, (time.perf_counter() - t0) * 1000, version))

        await asyncio.gather(*(one() for _ in range(clients)))
    return samples, failures, sent


def _client_proc(args: tuple[Any, ...], out: Any) -> None:
    out.send(asyncio.run(_closed_loop(*args)))
    out.close()


# ----------------------------------------------------------------------------- a run


#: The version a control run's "reload" waits for: none ever answers.
NO_VERSION = 1 << 60


@dataclass
class Reload:
    edit_at: float
    done_at: float
    #: Version expected to serve after this reload.
    version: int
    total_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    first_new_at: float | None = None

    @property
    def window_end(self) -> float:
        return max(self.done_at, self.first_new_at or self.done_at)


@dataclass
class RunResult:
    clients: int
    sent: int
    samples: list[tuple[float, float, int]]
    failures: list[float]
    reloads: list[Reload] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    #: [reload done, standby worker ready] (strategy respawn with a standby): the next
    #: worker starting in the background, outside any reload window.
    standby_starts: list[tuple[float, float]] = field(default_factory=list)


def _edit(model_py: Path, k: int) -> None:
    text = model_py.read_text()
    start = text.index("SCALE = ")
    stop = text.index("\n", start)
    model_py.write_text(text[:start] + f"SCALE = {1.0 + k / 1000:.3f}" + text[stop:])


async def _drive_reloads(
    url: str, model_py: Path, t_start: float, seconds: float, every: float, trigger: str
) -> list[Reload]:
    import aiohttp

    from hotreload.client import http_headers

    reloads: list[Reload] = []
    version = 1
    # The session's token (load needs it); none for another server (--server-cmd).
    auth = http_headers(model_py.parent / "hotreload.toml")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        k = 0
        while True:
            at = t_start + every / 2 + k * every
            if at > t_start + seconds - 0.5:
                break
            await asyncio.sleep(max(0.0, at - time.time()))
            k += 1
            edit_at = time.time()
            _edit(model_py, k)
            if trigger == "noop":
                # The control: the same edit and one HTTP request, and no reload at all.
                async with http.get(url + "/v2/models/mlp") as r:
                    await r.read()
                reloads.append(Reload(edit_at, time.time(), NO_VERSION))
                continue
            if trigger == "api":
                async with http.post(url + "/v2/repository/models/mlp/load", headers=auth) as r:
                    doc = await r.json()
                done_at = time.time()
                if r.status != 200:
                    print(f"  reload {k} failed: {doc.get('error')}", flush=True)
                    continue
                version = int(doc["version"])
                reloads.append(
                    Reload(edit_at, done_at, version, doc.get("total_s"), doc.get("phases", {}))
                )
            else:
                version += 1
                reloads.append(Reload(edit_at, edit_at, version))
    return reloads


def run_once(
    clients: int,
    seconds: float,
    every: float,
    trigger: str,
    server_cmd: str | None,
    strategy: str | None = None,
    transport: str = "http",
    build_pace: float | None = None,
    cpus: str | None = None,
) -> RunResult:
    tmp = Path(tempfile.mkdtemp(prefix="hr-http-bench-"))
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj, ignore=shutil.ignore_patterns(".hotreload"))
    config = proj / "hotreload.toml"
    if strategy:
        config.write_text(
            config.read_text().replace('strategy = "inplace"', f'strategy = "{strategy}"')
        )
    if build_pace is not None:
        text = config.read_text()
        config.write_text(
            text.replace('strategy = "', f'build_pace = {build_pace}\nstrategy = "', 1)
        )
    if cpus is not None:
        text = config.read_text()
        config.write_text(text.replace('strategy = "', f'cpus = "{cpus}"\nstrategy = "', 1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if server_cmd:
        cmd = shlex.split(server_cmd.format(config=config, port=port))
        ready = "serving"
    else:
        command = "watch" if trigger == "edit" else "serve"
        cmd = [sys.executable, "-m", "hotreload", command, "--config", str(config)]
        cmd += ["--http", f"127.0.0.1:{port}"] + (["--no-tui"] if command == "watch" else [])
        ready = "serving"
    server = Server(cmd, ready, proj)
    url = f"http://127.0.0.1:{port}"
    socket_path = None
    if transport == "socket":
        from hotreload.client import Client

        socket_path = str(Client(config=config).socket_path)
    try:
        ctx = mp.get_context("spawn")
        procs = 2
        t_start = time.time() + 2.0
        pipes, workers = [], []
        for i in range(procs):
            share = clients // procs + (1 if i < clients % procs else 0)
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_client_proc, args=((url, share, seconds, t_start, socket_path), child)
            )
            p.start()
            pipes.append(parent)
            workers.append(p)
        reloads = asyncio.run(
            _drive_reloads(url, proj / "model.py", t_start, seconds, every, trigger)
        )
        samples: list[tuple[float, float, int]] = []
        failures: list[float] = []
        sent = 0
        for parent, p in zip(pipes, workers, strict=True):
            s, f, n = parent.recv()
            samples += s
            failures += f
            sent += n
            p.join(30)
    finally:
        server.stop()
        # A fresh standby starting (imports) costs CPU; a recycled one is ready at once.
        standby_ready = [
            e["ts"]
            for e in read_events(proj)
            if e["kind"] == "standby_ready" and not e.get("recycled")
        ]
        shutil.rmtree(tmp, ignore_errors=True)
    samples.sort()
    standby_starts = []
    for rl in reloads:
        later = [t for t in standby_ready if t >= rl.done_at]
        if later:
            standby_starts.append((rl.done_at, min(later)))
    for rl in reloads:
        replies = [t + lat / 1000 for t, lat, v in samples if v >= rl.version and t >= rl.edit_at]
        rl.first_new_at = min(replies) if replies else None
    return RunResult(clients, sent, samples, failures, reloads, server.lines, standby_starts)


def report(r: RunResult, trigger: str) -> None:
    inside, steady = _split(r.samples, r.reloads)
    windows = [(rl.edit_at, rl.window_end) for rl in r.reloads]
    outside = [(t, lat) for t, lat, _ in r.samples if not _overlaps(t, lat, windows)]
    starting = [lat for t, lat in outside if _overlaps(t, lat, r.standby_starts)]
    quiet = [lat for t, lat in outside if not _overlaps(t, lat, r.standby_starts)]
    every = [lat for _, lat, _ in r.samples]
    e2v = [rl.first_new_at - rl.edit_at for rl in r.reloads if rl.first_new_at]
    totals = [rl.total_s for rl in r.reloads if rl.total_s is not None]
    versions = sorted({v for _, _, v in r.samples})
    print(
        f"\n{r.clients} clients: sent {r.sent}, ok {len(r.samples)}, failed {len(r.failures)}, "
        f"{len(r.reloads)} reloads ({trigger}), versions {versions[0]}..{versions[-1]}"
    )
    print(f"  {'':<26} {'n':>7} {'p50 ms':>8} {'p99 ms':>8}")
    rows = [("overall", every), ("steady", steady)]
    if r.standby_starts:
        rows += [("  of which standby starting", starting), ("  of which quiet", quiet)]
    rows.append(("inside reload windows", inside))
    if trigger != "none: control":
        by_old, by_new = _by_version(r)
        rows += [("  of which old version", by_old), ("  of which new version", by_new)]
    for label, values in rows:
        print(
            f"  {label:<26} {len(values):>7} {percentile(values, 50):>8.2f} "
            f"{percentile(values, 99):>8.2f}"
        )
    if steady and inside:
        print(
            f"  p99 inside / steady: {percentile(inside, 99) / percentile(steady, 99):.2f}x "
            f"(p50: {percentile(inside, 50) / percentile(steady, 50):.2f}x)"
        )
    if r.standby_starts and quiet and inside:
        ratio = percentile(inside, 99) / percentile(quiet, 99)
        print(f"  p99 inside / quiet steady (no standby starting): {ratio:.2f}x")
    if e2v:
        print(
            f"  edit -> first new-version answer: median {statistics.median(e2v) * 1000:.0f} ms, "
            f"max {max(e2v) * 1000:.0f} ms"
        )
    if totals:
        print(
            f"  reload (load+warm+smoke+swap...) as the engine timed it: median "
            f"{statistics.median(totals) * 1000:.0f} ms, max {max(totals) * 1000:.0f} ms"
        )
        names = list(dict.fromkeys(k for rl in r.reloads for k in rl.phases))
        medians = [
            f"{k} {statistics.median(rl.phases.get(k, 0.0) for rl in r.reloads) * 1000:.0f}"
            for k in names
        ]
        print(f"  median phase ms: {', '.join(medians)}")


#: The control configuration (`--control`).
CONTROL = "control"


@dataclass(frozen=True)
class Variant:
    """One configuration of a side-by-side run (None: the example's own setting)."""

    strategy: str | None = None
    pace: float | None = None
    cpus: str | None = None

    def label(self) -> str:
        if self.strategy == CONTROL:
            return "control: the same edits and requests, no reload"
        st = f"strategy {self.strategy}" if self.strategy else "the example's strategy"
        if self.pace is not None:
            st += f", build_pace = {self.pace:g}"
        return st + (f", cpus = {self.cpus}" if self.cpus is not None else "")


def _stretch_control_windows(control: RunResult, pooled: dict[Variant, RunResult]) -> None:
    """Give the control's edits windows as long as the median reload window so far."""
    spans = [
        rl.window_end - rl.edit_at
        for key, r in pooled.items()
        if key.strategy != CONTROL
        for rl in r.reloads
    ]
    length = statistics.median(spans) if spans else 0.1
    for rl in control.reloads:
        rl.done_at = rl.edit_at + length


def _merge(into: RunResult | None, r: RunResult) -> RunResult:
    """Pool runs: windows are absolute wall times, so samples and reloads just add up."""
    if into is None:
        return r
    return RunResult(
        r.clients,
        into.sent + r.sent,
        sorted(into.samples + r.samples),
        into.failures + r.failures,
        into.reloads + r.reloads,
        into.lines + r.lines,
        into.standby_starts + r.standby_starts,
    )


def _ratio_line(r: RunResult) -> str:
    inside, steady = _split(r.samples, r.reloads)
    if not inside or not steady:
        return f"failed {len(r.failures)}, no reload window measured"
    return (
        f"failed {len(r.failures)}, p99 steady {percentile(steady, 99):.1f} ms, inside "
        f"{percentile(inside, 99):.1f} ms ({percentile(inside, 99) / percentile(steady, 99):.2f}x)"
    )


def _by_version(r: RunResult) -> tuple[list[float], list[float]]:
    """In-window latencies answered by the version serving before the reload (in the old
    worker, up to the hand-over) and by the reload's new version."""
    old: list[float] = []
    new: list[float] = []
    for t, lat, version in r.samples:
        for rl in r.reloads:
            if _overlaps(t, lat, [(rl.edit_at, rl.window_end)]):
                (new if version >= rl.version else old).append(lat)
                break
    return old, new


def _split(
    samples: list[tuple[float, float, int]], reloads: list[Reload]
) -> tuple[list[float], list[float]]:
    """Latencies of requests overlapping a reload window, and of all the others."""
    windows = [(rl.edit_at, rl.window_end) for rl in reloads]
    inside: list[float] = []
    steady: list[float] = []
    for t, lat, _ in samples:
        (inside if _overlaps(t, lat, windows) else steady).append(lat)
    return inside, steady


def _overlaps(t: float, lat_ms: float, spans: list[tuple[float, float]]) -> bool:
    end = t + lat_ms / 1000
    return any(t <= w1 and end >= w0 for w0, w1 in spans)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[32, 200])
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between reloads")
    parser.add_argument("--trigger", choices=("api", "edit"), default="api")
    parser.add_argument(
        "--strategy",
        choices=("inplace", "respawn"),
        nargs="+",
        help="override the example's strategy (several: side by side)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="add a run with the same edits and one metadata request per cycle but no reload, "
        "its windows as long as the median reload window: the harness's own share",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every configuration, interleaved; figures pooled over the rounds "
        "(p99 of a few hundred in-window requests moves by 0.1x between identical runs)",
    )
    parser.add_argument(
        "--build-pace",
        type=float,
        nargs="+",
        help="run once per value of the model's build_pace (0: build at full speed), side by side",
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        help='the model\'s `cpus` setting ("auto": serving worker on a CPU of its own, '
        '"off": wherever the scheduler puts it), several side by side',
    )
    parser.add_argument(
        "--transport",
        choices=("http", "socket"),
        default="http",
        help="socket: the same run with Unix-socket clients, to tell HTTP's share apart",
    )
    parser.add_argument(
        "--server-cmd",
        help="command serving HTTP on {port} for {config}, printing 'serving' when ready "
        "(default: `hotreload serve --http`, or `hotreload watch --http` with --trigger edit)",
    )
    args = parser.parse_args()
    strategies = args.strategy or [None]
    print(
        f"HTTP reload benchmark: example MLP, 1x64 FP32 binary, reload every {args.every:g} s "
        f"for {args.seconds:g} s, {os.cpu_count()} cores, {args.transport} clients, "
        f"{args.repeat} round(s)"
    )
    for clients in args.clients:
        configs = [
            Variant(st, pace, cpus)
            for st in strategies
            for pace in args.build_pace or [None]
            for cpus in args.cpus or [None]
        ]
        if args.control:
            configs.append(Variant(CONTROL))
        pooled: dict[Variant, RunResult] = {}
        for round_no in range(1, args.repeat + 1):
            for v in configs:
                control = v.strategy == CONTROL
                r = run_once(
                    clients,
                    args.seconds,
                    args.every,
                    "noop" if control else args.trigger,
                    args.server_cmd,
                    None if control else v.strategy,
                    args.transport,
                    v.pace,
                    v.cpus,
                )
                if control:
                    _stretch_control_windows(r, pooled)
                if args.repeat > 1:
                    print(f"  round {round_no}, {v.label()}: {_ratio_line(r)}", flush=True)
                pooled[v] = _merge(pooled.get(v), r)
        for v, r in pooled.items():
            print(f"\n--- {v.label()}", flush=True)
            report(r, "none: control" if v.strategy == CONTROL else args.trigger)
    return 0


if __name__ == "__main__":
    sys.exit(main())

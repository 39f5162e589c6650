"""Instructions the HTTP front (the session process) runs per KServe infer request, counted
by callgrind: a figure the machine's load does not move, unlike CPU seconds.

    .venv/bin/python benchmarks/front_instructions.py [--requests 2000] [--clients 1 32]
        [--idle-s 10] [--keep DIR]

The example MLP's session (`hotreload watch --no-tui --http`, as
`triton_side_by_side.py` runs it) starts under `valgrind --tool=callgrind
--instr-atstart=no`; its worker is another program (fork+exec) and runs natively. Once the
model is ready and a warm-up has run, instrumentation goes on (`callgrind_control -i on`).
Then, for each measurement, the counters are zeroed, the load runs (the same JSON 1x64 FP32
body and aiohttp client as `triton_side_by_side.py`), and the counts are dumped:

- idle: `--idle-s` seconds without requests, for what the session does on its own (timers,
  the watcher, the stats sampler) per second;
- per client count: `--requests` requests from that many concurrent clients on keep-alive
  connections.

Reported per client count: instructions (Ir) per request, raw and with the idle rate times
the run's wall time taken off (the figure to compare; under callgrind the front runs ~50x
slower, so a run lasts tens of seconds). `--keep DIR` keeps the callgrind files, for
`callgrind_annotate --inclusive=yes DIR/callgrind.out.c32.*` (the profile of that run).
Figures, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, stop_server, wait_ready

BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
).encode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _load(url: str, clients: int, requests: int) -> int:
    """Send `requests` infer requests from `clients` concurrent clients; failures."""
    import aiohttp

    failed = 0
    left = requests
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=600)
    ) as http:

        async def one() -> None:
            nonlocal failed, left
            while left > 0:
                left -= 1
                async with http.post(url + "/v2/models/mlp/infer", data=BODY) as r:
                    doc = await r.json(content_type=None)
                    if r.status != 200 or "outputs" not in doc:
                        failed += 1

        await asyncio.gather(*(one() for _ in range(clients)))
    return failed


def _control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120
    )


def _dump(pid: int, out_dir: Path, label: str) -> int:
    """Dump the counts since the last zeroing; the Ir total of that dump."""
    before = set(glob.glob(str(out_dir / "callgrind.out.*")))
    _control(pid, f"--dump={label}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = sorted(set(glob.glob(str(out_dir / "callgrind.out.*"))) - before)
        for path in new:
            text = Path(path).read_text(errors="replace")
            m = re.search(r"^totals:\s+(\d+)", text, re.M)  # the file's last line
            if m:
                os.replace(path, out_dir / f"callgrind.out.{label}")
                return int(m.group(1))
        time.sleep(0.2)
    raise SystemExit(f"no callgrind dump for {label} within 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="hr-front-ir-"))
    out_dir = args.keep or tmp / "cg"
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in glob.glob(str(out_dir / "callgrind.out.*")):
        os.remove(old)
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj, ignore=shutil.ignore_patterns(".hotreload"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_dir}/callgrind.out.%p",
        sys.executable,
        "-m",
        "hotreload",
        "watch",
        "--no-tui",
        "--config",
        str(proj / "hotreload.toml"),
        "--http",
        f"127.0.0.1:{port}",
    ]
    log = (tmp / "session.log").open("w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=proj, start_new_session=True
    )
    try:
        wait_ready(url, proc, 600)
        asyncio.run(_load(url, 4, args.warmup))
        _control(proc.pid, "--instr=on")
        asyncio.run(_load(url, 4, 50))  # code first met with instrumentation on
        _control(proc.pid, "--zero")
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        idle_ir = _dump(proc.pid, out_dir, "idle")
        idle_rate = idle_ir / (time.monotonic() - t0)
        print(f"idle: {idle_rate / 1e3:.0f}K instructions/s")
        print(f"{'clients':>7} {'requests':>8} {'wall s':>7} {'Ir/request':>11} {'less idle':>10}")
        for clients in args.clients:
            _control(proc.pid, "--zero")
            t0 = time.monotonic()
            failed = asyncio.run(_load(url, clients, args.requests))
            wall = time.monotonic() - t0
            ir = _dump(proc.pid, out_dir, f"c{clients}")
            if failed:
                print(f"  {failed} requests failed: see {tmp / 'session.log'}")
            net = (ir - idle_rate * wall) / args.requests
            print(
                f"{clients:>7} {args.requests:>8} {wall:>7.1f} {ir / args.requests / 1e3:>10.1f}K "
                f"{net / 1e3:>9.1f}K",
                flush=True,
            )
    finally:
        stop_server(proc, 120)  # valgrind's session takes its time to end
        shutil.rmtree(tmp, ignore_errors=True)
    if args.keep:
        print(f"callgrind files in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

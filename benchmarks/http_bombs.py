"""Gzip bombs against the HTTP endpoint: how long one takes to be refused, and what valid
requests sent meanwhile cost.

    .venv/bin/python benchmarks/http_bombs.py [--bomb-mib 1024] [--bombs 3] [--port 18790]

Starts `hotreload serve --http` on a copy of the example, then one closed-loop client sends
valid JSON infer requests for 1 s (the baseline) and on while `--bombs` requests carry a
gzip body of `--bomb-mib` MiB of zeros (about 1 MiB on the wire). Figures, not a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VALID = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
).encode()


def gzip_zeros(mib: int) -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join([co.compress(b"\0" * 2**20) for _ in range(mib)] + [co.flush()])


def post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> int:
    conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bomb-mib", type=int, default=1024)
    ap.add_argument("--bombs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18790)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hotreload-bombs-"))
    shutil.copytree(REPO / "examples" / "mlp", folder / "proj")
    config = folder / "proj" / "hotreload.toml"
    server = subprocess.Popen(
        [sys.executable, "-m", "hotreload", "serve", "--config", str(config),
         "--http", f"127.0.0.1:{args.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if line.startswith("serving "):
                break
        else:
            raise SystemExit("the session did not start")
        bomb = gzip_zeros(args.bomb_mib)
        latencies: list[float] = []
        stop = threading.Event()

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
            while not stop.is_set():
                t = time.perf_counter()
                post(conn, VALID, {"Content-Type": "application/json"})
                latencies.append(time.perf_counter() - t)

        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(1.0)
        before, latencies[:] = list(latencies), []
        refusals = []
        for _ in range(args.bombs):
            conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=120)
            t = time.perf_counter()
            status = post(conn, bomb, {"Content-Encoding": "gzip"})
            refusals.append((time.perf_counter() - t, status))
            conn.close()
        stop.set()
        thread.join(60)
        print(f"bomb: {len(bomb) / 2**20:.2f} MiB gzip of {args.bomb_mib} MiB zeros")
        print("refused in: " + ", ".join(f"{s:.2f} s ({code})" for s, code in refusals))
        for label, lat in (("valid, before", before), ("valid, during bombs", latencies)):
            print(
                f"{label}: p50 {pct(lat, 0.5):.2f} ms, p99 {pct(lat, 0.99):.2f} ms, "
                f"max {pct(lat, 1.0):.2f} ms (n={len(lat)})"
            )
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

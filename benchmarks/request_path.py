"""Request path benchmark: hotreload's routed round trip against a direct in-process call,
a bare Unix-socket echo written the same way, and a bare two-hop relay (`relay_server.py`:
the manager's and the worker's I/O with nothing else, the floor two process boundaries
set), for 1 and 32 concurrent clients; then a payload sweep from 1 KiB to 32 MiB.

    .venv/bin/python benchmarks/request_path.py [--seconds 4] [--sweep-seconds 1.5]

Targets: routed p50 within 1.3x of the bare two-hop relay at 1 and at 32 clients;
>= 5,000 req/s at 32 clients on 2 cores with a trivial model; at 4 MiB and above, at least
half the relay's MB/s (one client, an identity model: transport only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import HEADER, REPO, LoadResult, Server, drive, percentile

TRIVIAL = """
import torch

class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2

def build():
    return Double()

def example():
    return torch.zeros(1, 64)
"""


def direct(label: str, model, x, seconds: float) -> LoadResult:  # type: ignore[no-untyped-def]
    import torch

    lat: list[float] = []
    end = time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            model(x)
            lat.append((time.perf_counter() - t0) * 1000)
    return LoadResult(label, 1, len(lat), len(lat), 0, seconds, lat, [])


IDENTITY = """
import torch

class Identity(torch.nn.Module):
    def forward(self, x):
        return x

def build():
    return Identity()

def example():
    return torch.zeros(1, 64)
"""

#: Request payloads of the sweep (the reply is as large).
SWEEP_BYTES = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 32 << 20]


def sweep(paths: dict[str, tuple[str, str]], seconds: float) -> list[tuple[int, dict[str, float]]]:
    """MB/s of request payload, one closed-loop client, for each size and path."""
    out = []
    for nbytes in SWEEP_BYTES:
        rows = nbytes // (64 * 4)
        figures = {}
        for label, (sock, model) in paths.items():
            r = drive(sock, model, 1, seconds, rows=rows, label=label)
            figures[label] = r.ok * nbytes / seconds / 1e6 if not r.failed else float("nan")
        out.append((nbytes, figures))
    return out


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each run")
    parser.add_argument(
        "--sweep-seconds", type=float, default=1.5, help="duration of each payload-sweep run"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hr-bench-"))
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj)
    (proj / "trivial.py").write_text(TRIVIAL)
    (proj / "identity.py").write_text(IDENTITY)
    with (proj / "hotreload.toml").open("a") as f:
        f.write(
            '\n[[models]]\nname = "trivial"\nentry = "trivial.py:build"\n'
            'example = "trivial.py:example"\nthreads = 1\nmax_inflight = 16\n'
            '\n[[models]]\nname = "identity"\nentry = "identity.py:build"\n'
            'example = "identity.py:example"\nthreads = 1\nrequest_timeout_s = 60\n'
        )
    echo_sock = str(tmp / "echo.sock")
    py = sys.executable
    server = Server(
        [py, "-m", "hotreload", "serve", "--config", str(proj / "hotreload.toml")], "serving ", proj
    )
    echo = Server([py, str(REPO / "benchmarks" / "echo_server.py"), echo_sock], "echo ready", proj)
    relay_sock = str(tmp / "relay.sock")
    relay = Server(
        [py, str(REPO / "benchmarks" / "relay_server.py"), relay_sock], "relay ready", proj
    )
    try:
        from hotreload.client import Client

        sock = str(Client(config=proj / "hotreload.toml").socket_path)
        import torch

        torch.set_num_threads(1)
        sys.path.insert(0, str(proj))
        import model as example  # type: ignore[import-not-found]
        import trivial  # type: ignore[import-not-found]

        x = torch.from_numpy(np.zeros((1, 64), np.float32))
        rows: list[LoadResult] = [
            direct("direct in-process: example mlp", example.build().eval(), x, args.seconds),
            direct("direct in-process: trivial", trivial.build(), x, args.seconds),
        ]
        for clients, procs in ((1, 1), (32, 2)):
            rows.append(
                drive(
                    echo_sock, "echo", clients, args.seconds, procs=procs, label="bare socket echo"
                )
            )
            rows.append(
                drive(
                    relay_sock,
                    "echo",
                    clients,
                    args.seconds,
                    procs=procs,
                    label="bare two-hop relay",
                )
            )
            rows.append(
                drive(
                    sock,
                    "trivial",
                    clients,
                    args.seconds,
                    procs=procs,
                    label="hotreload routed: trivial",
                )
            )
            rows.append(
                drive(
                    sock,
                    "mlp",
                    clients,
                    args.seconds,
                    procs=procs,
                    label="hotreload routed: example mlp",
                )
            )
        sizes = sweep(
            {
                "bare socket echo": (echo_sock, "echo"),
                "bare two-hop relay": (relay_sock, "echo"),
                "hotreload routed": (sock, "identity"),
            },
            args.sweep_seconds,
        )
    finally:
        server.stop()
        echo.stop()
        relay.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"request path, 1x64 float32, {args.seconds:g} s per run, {os.cpu_count()} cores")
    print(HEADER)
    for r in rows:
        print(r.row())
    by = {(r.label, r.clients): r for r in rows}
    echo1, triv1 = by[("bare socket echo", 1)], by[("hotreload routed: trivial", 1)]
    echo32, triv32 = by[("bare socket echo", 32)], by[("hotreload routed: trivial", 32)]
    mlp1, direct_mlp = (
        by[("hotreload routed: example mlp", 1)],
        by[("direct in-process: example mlp", 1)],
    )
    print()
    print(f"routed/echo p50, 1 client:                       {triv1.p50 / echo1.p50:.2f}x")
    print(f"routed/echo p50, 32 clients:                     {triv32.p50 / echo32.p50:.2f}x")
    relay1, relay32 = by[("bare two-hop relay", 1)], by[("bare two-hop relay", 32)]
    print(f"two-hop relay/echo p50, 1 client (the floor):    {relay1.p50 / echo1.p50:.2f}x")
    print(f"two-hop relay/echo p50, 32 clients:              {relay32.p50 / echo32.p50:.2f}x")
    print(f"routed/two-hop relay p50, 1 client (<= 1.3):     {triv1.p50 / relay1.p50:.2f}x")
    print(f"routed/two-hop relay p50, 32 clients (<= 1.3):   {triv32.p50 / relay32.p50:.2f}x")
    print(f"routed throughput, 32 clients (target >= 5000):  {triv32.rps:.0f} req/s")
    print(f"routed/echo throughput, 32 clients:              {triv32.rps / echo32.rps:.2f}x")
    overhead = mlp1.p50 - percentile(direct_mlp.latencies_ms, 50)
    print(f"example mlp: routed p50 - direct p50, 1 client:  {overhead:.3f} ms")
    print()
    print(
        f"payload sweep: MB/s of request payload (reply as large), 1 client, "
        f"{args.sweep_seconds:g} s per run"
    )
    print(f"{'payload':>8} {'echo':>9} {'relay':>9} {'hotreload':>10} {'hr/relay':>9}")
    for nbytes, f in sizes:
        echo_mb, relay_mb, hr_mb = (
            f["bare socket echo"],
            f["bare two-hop relay"],
            f["hotreload routed"],
        )
        mark = "  (target >= 0.5)" if nbytes >= 4 << 20 else ""
        print(
            f"{_size(nbytes):>8} {echo_mb:>9.1f} {relay_mb:>9.1f} {hr_mb:>10.1f} "
            f"{hr_mb / relay_mb:>8.2f}x{mark}"
        )
    failed = sum(r.failed for r in rows)
    print(f"failed requests: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

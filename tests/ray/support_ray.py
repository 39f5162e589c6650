"""A local Ray cluster for the tests and the benchmark: started with `ray start --head
--block` in a process group of its own on 127.0.0.1, stopped by that group's pids.

Not `ray stop`: it stops every Ray process of the machine's user, another run's too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayCluster:
    """`ray start --head --block` on 127.0.0.1 with ports of its own; `stop()` ends it."""

    def __init__(
        self,
        num_cpus: int = 8,
        start_timeout_s: float = 180.0,
        attempts: int = 3,
        http_port: int | None = None,
    ) -> None:
        """`http_port`: Ray's HTTP proxy port, when a config written before the start names
        it (else a free one)."""
        self.fixed_http_port = http_port
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hr-ray-", dir="/tmp"))  # short: sockets
        # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: on SIGTERM, `ray start --block` first
        # marks its node as draining and waits up to this long (Ray's default: 30 s) for the
        # raylet to report it drained, a wait for a Kubernetes pod's proxies to stop taking
        # traffic. `stop()` SIGTERMs the whole process group at once, so nothing is left to
        # drain and every stop sat out the full 30 s; 0 is Ray's own "tear down at once".
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.known: set[int] = set()
        self.stopped = False
        # `ray start` gives its raylet a fixed 30 s to register, which an overloaded machine
        # misses now and then: a failed start is stopped and tried again, a few times.
        for attempt in range(1, attempts + 1):
            self._start(num_cpus)
            deadline = time.monotonic() + start_timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.get("/api/serve/applications/")
                    return
                except (OSError, urllib.error.URLError, ValueError):
                    self._remember()
                    time.sleep(1.0)
            why = (
                f"ray start exited: {self.start_log()[-3000:]}"
                if self.proc.poll() is not None
                else f"Ray's dashboard did not answer in {start_timeout_s:.0f} s"
            )
            self.stop()
            if attempt == attempts:
                raise RuntimeError(why)
            self.stopped = False
            self.known = set()

    def _start(self, num_cpus: int) -> None:
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.http_port = self.fixed_http_port or free_port()
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.log = open(self.temp_dir / "ray-start.log", "wb")  # noqa: SIM115 (closed in stop)
        cmd = [
            str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--port={self.gcs_port}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
            f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--ray-client-server-port={free_port()}", f"--num-cpus={num_cpus}",
            f"--temp-dir={self.temp_dir}", "--include-dashboard=true",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def start_log(self) -> str:
        return (self.temp_dir / "ray-start.log").read_text(errors="replace")

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        with urllib.request.urlopen(self.dashboard + path, timeout=timeout_s) as r:
            return json.loads(r.read())

    def serve(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "serve"), *args, "-a", self.dashboard],
            capture_output=True, text=True, timeout=timeout_s, env=self.env,
        )  # fmt: skip

    def deploy(self, config: Path) -> None:
        done = self.serve("deploy", str(config))
        if done.returncode != 0:
            raise RuntimeError(f"serve deploy failed:\n{done.stdout}\n{done.stderr}")

    def put_config(self, config: Path, timeout_s: float = 60.0) -> None:
        """The request `serve deploy CONFIG` sends (PUT /api/serve/applications/, the YAML's
        content as JSON, checked by Ray against the same ServeDeploySchema), without the
        CLI's process: its start imports Ray, seconds of CPU that on two cores shared with a
        test's 16 clients took 20 s before the request left."""
        import yaml  # Ray's own dependency: installed wherever Ray is

        body = json.dumps(yaml.safe_load(config.read_text())).encode()
        req = urllib.request.Request(
            self.dashboard + "/api/serve/applications/",
            body,
            {"Content-Type": "application/json"},
            method="PUT",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"Ray refused {config}: HTTP {exc.code}: {exc.read().decode(errors='replace')}"
            ) from None

    def applications(self) -> dict[str, Any]:
        return dict(self.get("/api/serve/applications/")["applications"])

    def wait_running(self, names: list[str], timeout_s: float = 180.0) -> dict[str, Any]:
        """Every application RUNNING with each deployment's replicas all RUNNING."""
        deadline = time.monotonic() + timeout_s
        apps: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self._remember()
            apps = self.applications()
            states = [apps.get(n, {}).get("status") for n in names]
            if "DEPLOY_FAILED" in states:
                raise RuntimeError(f"deploy failed: {json.dumps(apps, indent=1)[-4000:]}")
            if all(s == "RUNNING" for s in states) and all(
                all(r["state"] == "RUNNING" for r in d["replicas"])
                for n in names
                for d in apps[n]["deployments"].values()
            ):
                return apps
            time.sleep(1.0)
        raise TimeoutError(f"not RUNNING in {timeout_s:.0f} s: {json.dumps(apps)[-4000:]}")

    def pids(self, app: str) -> set[int]:
        deployments = self.applications()[app]["deployments"].values()
        return {r["pid"] for d in deployments for r in d["replicas"] if r["state"] == "RUNNING"}

    def _remember(self) -> None:
        try:
            self.known |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.Error:
            pass

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to `ray start --block` (it stops what it started), then SIGKILL to any pid
        of its process group or tree left after `timeout_s`. Once only: the pids are not ours
        to signal after that (the system may give them to other processes)."""
        if self.stopped:
            return
        self.stopped = True
        self._remember()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        left = []
        for pid in self.known | {self.proc.pid}:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                pass
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)
        self.log.close()

    def alive(self) -> list[int]:
        out = []
        for pid in self.known | {self.proc.pid}:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.Error:
                pass
        return out


def infer_mlp(
    port: int, x: np.ndarray, timeout_s: float = 30.0
) -> tuple[np.ndarray, dict[str, Any]]:
    """One JSON KServe v2 request to the mlp model (as curl sends it): its output, and the
    response's parameters with its model_version."""
    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                     "data": x.reshape(-1).tolist()}]}
    ).encode()  # fmt: skip
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/mlp/infer", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        doc = json.loads(r.read())
    out = doc["outputs"][0]
    params = {**doc.get("parameters", {}), "model_version": doc["model_version"]}
    return np.asarray(out["data"], np.float32).reshape(out["shape"]), params


@dataclass
class Load:
    """Closed-loop clients: each sends its next request when the last one answered."""

    port: int
    clients: int = 16
    x: np.ndarray = field(default_factory=lambda: np.ones((1, 64), np.float32))
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    #: (time sent, latency s, weights digest) for every answer.
    answers: list[tuple[float, float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                _, params = infer_mlp(self.port, self.x)
            except Exception as exc:  # every failure counts, whatever its kind
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.ok += 1
                self.answers.append(
                    (t0, time.perf_counter() - t0, str(params.get("weights_digest")))
                )

    def __enter__(self) -> Load:
        self._threads = [
            threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(60)

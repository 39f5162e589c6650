"""Helpers for the tests on a real tritonserver: free ports, starting the wheel's server on
a repository, and the set of processes shared by a module's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hotreload.export.local_triton import LocalTriton, ensure_python_env

#: Pids of the shared servers (and their children): not "left over" after a test.
from tests.support import SHARED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TritonProcess:
    """One tritonserver: its HTTP address and its log."""

    proc: subprocess.Popen  # type: ignore[type-arg]
    http: str
    grpc: str
    log: Path
    extra: list[str] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the stubs too
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        SHARED.discard(self.proc.pid)


def start_triton(triton: LocalTriton, repository: Path, work: Path, *extra: str) -> TritonProcess:
    """tritonserver on `repository`, on free ports; the caller closes it."""
    backends = triton.backends(work / "backends")
    python_env = ensure_python_env()
    ports = {k: free_port() for k in ("http", "grpc", "metrics")}
    cmd = triton.command(
        repository,
        backends,
        http_port=ports["http"],
        grpc_port=ports["grpc"],
        metrics_port=ports["metrics"],
        # A test has nothing in flight at its close: tritonserver otherwise waits its
        # default 30 s exit timeout for the models to unload (measured: 30.4 s a close).
        extra=("--exit-on-error=false", "--exit-timeout-secs=3", *extra),
    )
    log = work / f"tritonserver-{ports['http']}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            env=triton.env(python_env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    SHARED.add(proc.pid)
    return TritonProcess(
        proc, f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}", log, list(extra)
    )

"""Test helpers: example projects in temp folders and `hotreload serve` in a real process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "mlp"
#: Pids of processes a module shares across its tests (a tritonserver, a Ray cluster's
#: `ray start`): the suite's leftover-children check leaves their trees alone.
SHARED: set[int] = set()
#: What `Traffic` sends: the example's input shape.
TRAFFIC_INPUT = np.random.default_rng(3).standard_normal((1, 64), dtype=np.float32)


def make_project(
    tmp_path: Path, *, config: str | None = None, files: dict[str, str] | None = None
) -> Path:
    """Copy the example into tmp_path/proj, optionally replace the config and add files."""
    proj = tmp_path / "proj"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("__pycache__", ".hotreload"))
    for name, text in (files or {}).items():
        (proj / name).write_text(text)
    if config is not None:
        (proj / "hotreload.toml").write_text(config)
    return proj / "hotreload.toml"


def import_file(path: Path, name: str) -> Any:
    """The module at `path`, imported here under `name` (not added to sys.modules): the
    model called in-process, to compare a served answer with."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_events(config: Path) -> list[dict]:
    """The session's .hotreload/events.jsonl as a list of events."""
    import json

    path = config.parent / ".hotreload" / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line being written right now
    return events


def count_events(config: Path, kind: str, **match: object) -> int:
    return sum(
        1
        for e in read_events(config)
        if e.get("kind") == kind and all(e.get(k) == v for k, v in match.items())
    )


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "condition",
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class ServeProcess:
    """`python -m hotreload serve --config PATH` with its output captured line by line."""

    Factory = Callable[..., "ServeProcess"]

    def __init__(
        self, config: Path, *args: str, command: str = "serve", env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hotreload", command, "--config", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=str(config.parent),
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and not any(text in line for line in self.lines):
                raise AssertionError(
                    f"serve exited with {self.proc.returncode} before {text!r}:\n{self.output}"
                )
            return any(text in line for line in self.lines)

        wait_until(seen, timeout, what=f"{text!r} in output:\n{self.output}")

    def wait_ready(self, timeout: float = 90.0) -> None:
        self.wait_for("serving ", timeout)

    def worker_pids(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)

    def close(self) -> None:
        """Stop gracefully, then kill the whole process group: nothing may outlive a test."""
        kids = self.worker_pids()
        if self.proc.poll() is None:
            try:
                self.stop(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        kill_groups(self.proc, kids)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def kill_groups(proc: subprocess.Popen, kids: list[int]) -> None:  # type: ignore[type-arg]
    """SIGKILL the process groups of `proc` and of `kids` (workers lead groups of their own),
    then reap `proc`: the last resort of every test that starts a session."""
    for pid in [proc.pid, *kids]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


class Traffic:
    """Client threads sending continuously; records (version, output) and every failure."""

    def __init__(self, config: Path, threads: int = 4) -> None:
        from hotreload import Client

        self.client = Client(config=config, timeout_s=30)
        self.results: list[tuple[int, Any]] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out, version, _ = self.client.infer("mlp", TRAFFIC_INPUT)
                self.results.append((version, out))
            except Exception as exc:
                self.failures.append(exc)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
            assert not t.is_alive(), "a client thread hung"


P = TypeVar("P", bound=ServeProcess)


@contextmanager
def shared_server(
    config: Path,
    *args: str,
    process_cls: type[P] = ServeProcess,  # type: ignore[assignment]
    command: str = "serve",
    ready_s: float = 180.0,
) -> Iterator[P]:
    """One session process shared by the tests of a module (or wider): `hotreload <command>
    --config CONFIG ARGS`, ready within `ready_s`, its pid in SHARED (the suite's
    leftover-children check leaves it to this helper), always stopped on leaving, then its
    process groups killed. A session and its workers importing torch cost seconds each."""
    server = process_cls(config, *args, command=command)
    SHARED.add(server.proc.pid)
    try:
        server.wait_ready(ready_s)
        yield server
    finally:
        SHARED.discard(server.proc.pid)
        server.close()

"""The port (engine/worker_port.py): one method per op, typed both ways, the same on the
real worker process and on the tests' fake.

One script of every control op runs against a real `WorkerProcess` (a worker importing
torch, on the CPU) and against the `FakeWorker` the engine's tests step a supervisor with:
both answer each op with the same reply class and the same versions, and fail the same op
the same way. So what the engine's tests prove on the fake holds at the real seam.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import signal
import time
import typing
from pathlib import Path
from typing import Any

import pytest

from hotreload.config import load_config
from hotreload.engine import worker_port
from hotreload.engine.worker_port import Worker, WorkerReplyError
from hotreload.engine.worker_proc import WorkerProcess
from hotreload.protocol.framing import Frame, pack_frame, unpack_body
from hotreload.protocol.messages import (
    OPS,
    REQUEST_PATH_OPS,
    DigestRequest,
    LoadRequest,
    OffloadRequest,
    PingRequest,
    ReleaseRequest,
    RestoreRequest,
    RetireRequest,
    ShutdownRequest,
    SmokeRequest,
    StatusRequest,
    SwapRequest,
    SyncRequest,
    WarmRequest,
)
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.support import make_project

PACKAGE = Path(__file__).resolve().parent.parent / "hotreload"


def _ops_named_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "WorkerOp"
    }


def test_the_worker_routes_every_op() -> None:
    assert _ops_named_in(PACKAGE / "worker" / "server.py") == set(WorkerOp.__members__)


def test_every_op_is_a_control_op_or_on_the_request_path() -> None:
    assert set(OPS) | REQUEST_PATH_OPS == set(WorkerOp)
    assert not set(OPS) & REQUEST_PATH_OPS


def test_the_port_has_one_method_per_control_op_typed_by_its_messages() -> None:
    """Each op but SHUTDOWN (which `end` sends) is a method named after it, taking its
    request class and returning its reply class."""
    for op, request in OPS.items():
        if op == WorkerOp.SHUTDOWN:
            continue
        method = getattr(Worker, op.value)
        hints = typing.get_type_hints(method, vars(worker_port))
        assert hints["request"] is request, op
        assert hints["return"] is request.reply, op
    for cls in (WorkerProcess, FakeWorker):
        assert issubclass(cls, Worker)
        assert not inspect.isabstract(cls), cls


def test_the_engine_builds_no_control_header_by_hand() -> None:
    """Control ops leave the engine only through the port's typed methods: a header written
    by hand (`{"op": WorkerOp.LOAD, ...}`) would skip the request class's checks. The
    request path (INFER, TEXT) is the one place headers are built."""
    control = {op.name for op in OPS}
    found = []
    for path in [*sorted((PACKAGE / "engine").rglob("*.py")), *(PACKAGE / "commands").glob("*.py")]:
        if path.name in ("worker_proc.py", "worker_port.py"):
            continue
        found += [f"{path.name}: WorkerOp.{n}" for n in sorted(_ops_named_in(path) & control)]
    assert found == []


def test_an_op_travels_as_its_plain_string() -> None:
    (frame,) = pack_frame({"op": WorkerOp.SWAP, "id": 3})
    header = unpack_body(bytes(frame)[4:]).header
    assert header == {"op": "swap", "id": 3} and type(header["op"]) is str


# ---------------------------------------------------------------------- one script, both sides


async def _script(worker: Worker) -> list[tuple[str, Any]]:
    """Every control op once or more, in a worker's real order; what each answered."""
    seen: list[tuple[str, Any]] = []

    def saw(reply: Any, value: Any = None) -> None:
        seen.append((type(reply).__name__, value))

    await worker.start(120.0)
    saw(await worker.ping(PingRequest(), 30.0))
    loaded = await worker.load(LoadRequest(1), 120.0)
    saw(loaded, len(loaded.inputs))
    saw(await worker.warm(WarmRequest(iters=2), 60.0))
    smoked = await worker.smoke(SmokeRequest(), 60.0)
    saw(smoked, len(smoked.outputs))
    saw(await worker.swap(SwapRequest(), 30.0), 1)
    saw(await worker.status(StatusRequest(), 30.0), "status")
    saw(await worker.sync(SyncRequest(), 30.0), "skipped")
    digest = await worker.digest(DigestRequest(), 60.0)
    saw(digest, isinstance(digest.digest, str) and digest.digest.startswith("sha256:"))
    await worker.load(LoadRequest(2, reimport=False), 120.0)
    await worker.warm(WarmRequest(iters=1), 60.0)
    await worker.smoke(SmokeRequest(), 60.0)
    swapped = await worker.swap(SwapRequest(inband=True, sync_deadline_s=1.0), 30.0)
    saw(swapped, (swapped.version, type(swapped.sync).__name__))
    saw(await worker.release(ReleaseRequest("retired"), 30.0))
    saw(await worker.offload(OffloadRequest(), 30.0))
    saw(await worker.restore(RestoreRequest(), 60.0), 2)
    with pytest.raises(WorkerReplyError, match="no version is staged"):
        await worker.swap(SwapRequest(), 30.0)
    saw(await worker.retire(RetireRequest(), 30.0))
    status = await worker.status(StatusRequest(), 30.0)
    saw(status, status.version)
    await worker.end(5.0)
    seen.append(("ended", (worker.alive, worker.dead.is_set())))
    return seen


EXPECTED = [
    ("Done", None),
    ("LoadReply", 1),
    ("WarmReply", None),
    ("SmokeReply", 1),
    ("SwapReply", 1),
    ("StatusReply", "status"),
    ("SyncReply", "skipped"),
    ("DigestReply", True),
    ("SwapReply", (2, "SyncReply")),
    ("FreedReply", None),
    ("Done", None),
    ("RestoreReply", 2),
    ("FreedReply", None),
    ("StatusReply", None),
    ("ended", (False, True)),
]


def test_the_fake_answers_the_script_as_the_port_says() -> None:
    assert asyncio.run(_script(FakeWorker(Script(), generation=1))) == EXPECTED


def test_the_real_worker_answers_the_same_script(tmp_path: Path) -> None:
    """The same script on a real worker process: the same classes, versions and failure."""
    config = load_config(make_project(tmp_path))
    assert asyncio.run(_script(WorkerProcess(config.models[0], config, 1))) == EXPECTED


def test_a_malformed_request_is_answered_naming_its_field(tmp_path: Path) -> None:
    """A header that is not its op's request class (here a LOAD without its version) is
    answered as a bad request by the worker, which carries on."""
    config = load_config(make_project(tmp_path))

    async def ask() -> tuple[dict[str, Any], Any]:
        worker = WorkerProcess(config.models[0], config, 1)
        await worker.start(120.0)
        try:
            fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            assert worker.submit({"op": WorkerOp.LOAD, "reimport": True}, (), fut)
            frame = await asyncio.wait_for(fut, 60.0)
            return frame.header, await worker.ping(PingRequest(), 30.0)
        finally:
            await worker.end()

    header, pong = asyncio.run(ask())
    assert header["ok"] is False and header["error"]["code"] == "bad_request"
    assert "load request without its field 'version'" in header["error"]["message"]
    assert type(pong).__name__ == "Done"


def test_end_is_bounded_when_the_worker_reads_nothing_any_more(tmp_path: Path) -> None:
    """A stopped process with megabytes queued for it: the SHUTDOWN's write never drains,
    and `end` still terminates and kills it within its grace and the kill's wait."""
    config = load_config(make_project(tmp_path))

    async def run() -> float:
        worker = WorkerProcess(config.models[0], config, 1)
        await worker.start(120.0)
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        for _ in range(8):  # 32 MiB: past the socket buffer and the transport's high water
            worker.submit(
                {"op": WorkerOp.INFER, "tensors": []}, [b"x" * (4 << 20)], loop.create_future()
            )
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(worker.end(1.0), 60.0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        assert not worker.alive and worker.dead.is_set()
        return time.monotonic() - t0

    assert asyncio.run(run()) < 30.0


def test_end_without_grace_kills_and_with_grace_asks_first(tmp_path: Path) -> None:
    config = load_config(make_project(tmp_path))

    async def run(grace_s: float) -> str | None:
        worker = WorkerProcess(config.models[0], config, 1)
        await worker.start(120.0)
        told: list[Worker] = []
        worker.on_death = told.append
        await worker.end(grace_s)
        await worker.end(grace_s)  # idempotent
        assert not worker.alive and worker.dead.is_set() and told == []
        return worker.exit_reason

    assert asyncio.run(run(0.0)) == "worker process was killed by SIGKILL"
    assert asyncio.run(run(10.0)) == "worker process exited with status 0"
    assert ShutdownRequest.reply.__name__ == "Done"

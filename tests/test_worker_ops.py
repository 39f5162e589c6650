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
    CANCELLED,
    OPS,
    PARTIAL,
    REQUEST_PATH_OPS,
    CancelRequest,
    DigestRequest,
    EvalRequest,
    LoadRequest,
    OffloadRequest,
    PingRequest,
    ReleaseRequest,
    RestoreRequest,
    RetireRequest,
    SaveRequest,
    ShutdownRequest,
    SmokeRequest,
    StatusRequest,
    SwapRequest,
    SyncRequest,
    WarmRequest,
)
from hotreload.protocol.ops import WorkerOp
from tests.stream_lm import count_project
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


async def _script(worker: Worker, folder: Path) -> list[tuple[str, Any]]:
    """Every control op once or more, in a worker's real order; what each answered.
    `folder`: where SAVE writes the serving weights."""
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
    saved = await worker.save(SaveRequest(str(folder), "mlp", digest.digest), 60.0)
    saw(saved, sorted(saved.files))
    with pytest.raises(WorkerReplyError, match="no `eval` is configured for this model"):
        await worker.eval(EvalRequest(1), 30.0)
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
    # A CANCEL for a request not running (ended, or never sent) is answered and does nothing.
    saw(await worker.cancel(CancelRequest(target=10_000), 30.0))
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
    ("SaveReply", ["hotreload.json", "model.safetensors"]),
    ("SwapReply", (2, "SyncReply")),
    ("FreedReply", None),
    ("Done", None),
    ("RestoreReply", 2),
    ("Done", None),
    ("FreedReply", None),
    ("StatusReply", None),
    ("ended", (False, True)),
]


def test_the_fake_answers_the_script_as_the_port_says(tmp_path: Path) -> None:
    assert asyncio.run(_script(FakeWorker(Script(), generation=1), tmp_path)) == EXPECTED


def test_the_real_worker_answers_the_same_script(tmp_path: Path) -> None:
    """The same script on a real worker process: the same classes, versions and failure."""
    config = load_config(make_project(tmp_path))
    saved = tmp_path / "saved"
    assert asyncio.run(_script(WorkerProcess(config.models[0], config, 1), saved)) == EXPECTED
    assert (saved / "model.safetensors").stat().st_size > 0


# ---------------------------------------------------------------------- streamed text, both sides


async def _streamed(
    worker: Worker, prompt: str, max_tokens: int, cancel_after: int = 0
) -> list[Frame]:
    """Every frame of one streamed completion, the final one last; with `cancel_after`, a
    CANCEL is sent once that many token frames came."""
    frames: asyncio.Queue[Frame] = asyncio.Queue()

    def got(frame: Frame | None, error: BaseException | None) -> None:
        assert frame is not None, error
        frames.put_nowait(frame)

    text = {
        "task": "complete",
        "prompts": [prompt],
        "sampling": {"max_tokens": max_tokens, "temperature": 0.0},
        "stream": True,
    }
    header: dict[str, Any] = {"op": WorkerOp.TEXT, "text": text}
    assert worker.submit(header, (), got)
    out: list[Frame] = []
    while not out or out[-1].header.get(PARTIAL):
        out.append(await asyncio.wait_for(frames.get(), 60.0))
        if cancel_after and len(out) == cancel_after:
            assert type(await worker.cancel(CancelRequest(header["id"]), 30.0)).__name__ == "Done"
    return out


async def _stream_script(worker: Worker) -> list[tuple[str, Any]]:
    """A streamed completion (a frame per token, each naming the version and digest, then
    the reply), and one stopped by a CANCEL at its next token."""
    await worker.start(120.0)
    await worker.load(LoadRequest(1), 120.0)
    await worker.swap(SwapRequest(), 30.0)
    *parts, last = await _streamed(worker, "ab", 4)
    final = last.header
    (choice,) = final["choices"]
    pieces = [p.header["choices"][0]["text"] for p in parts]
    seen: list[tuple[str, Any]] = [
        ("parts", len(parts)),
        ("one version", {p.header["version"] for p in parts} == {final["version"]} == {1}),
        ("one digest", {p.header["digest"] for p in parts} == {final["digest"]}),
        ("adds up", "".join(pieces) == choice["text"] and len(pieces[0]) > 0),
        ("ends", (choice["finish_reason"], final["usage"]["completion_tokens"])),
    ]
    *parts, last = await _streamed(worker, "ab", 900, cancel_after=2)
    error = last.header.get("error") or {}
    seen.append(("cancelled", (last.header["ok"], error.get("code"), len(parts) < 900)))
    seen.append(("counted", (await worker.status(StatusRequest(), 30.0)).cancelled))
    await worker.end(5.0)
    return seen


STREAM_EXPECTED = [
    ("parts", 4),
    ("one version", True),
    ("one digest", True),
    ("adds up", True),
    ("ends", ("length", 4)),
    ("cancelled", (False, CANCELLED, True)),
    ("counted", 1),
]


def test_the_fake_streams_as_the_port_says() -> None:
    assert asyncio.run(_stream_script(FakeWorker(Script(), generation=1))) == STREAM_EXPECTED


def test_the_real_worker_streams_the_same(tmp_path: Path) -> None:
    """The counting LM (tests/stream_lm.py: no end-of-text) streams its tokens, one frame
    each at 20 ms a token (the worker groups tokens made within 10 ms: STREAM_FRAME_S), and
    a CANCEL stops it long before its 900th."""
    config = load_config(count_project(tmp_path, delay_s=0.02))
    assert asyncio.run(_stream_script(WorkerProcess(config.models[0], config, 1))) == (
        STREAM_EXPECTED
    )


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

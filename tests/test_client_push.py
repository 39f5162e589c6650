"""The client side of a trainer's push: `update_weights`, `wait_version` and
`infer(min_version=...)`, against a small fake session on a real Unix socket (the
session's side of these ops is tested with the session itself)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotreload import Client
from hotreload.client import AsyncClient
from hotreload.errors import BadRequestError, ClientError, ProtocolError
from hotreload.protocol.framing import Frame, pack_frame, read_frame_sync, send_frame
from hotreload.protocol.shared_state import validate_descriptor
from hotreload.worker.pushed_state import read_state
from hotreload.worker.weights_digest import state_digest

Handler = Callable[[Frame], tuple[dict[str, Any], list[Any]]]


class FakeSession:
    """Answers each frame with `handler(frame)`; keeps every request header it saw."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[dict[str, Any]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    frame = read_frame_sync(conn, 1 << 26)
                except (ConnectionError, OSError):
                    return
                self.seen.append(frame.header)
                header, blobs = self.handler(frame)
                send_frame(conn, pack_frame({"id": frame.header.get("id"), **header}, blobs))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Callable[[Handler], tuple[FakeSession, Path]]]:
    made: list[FakeSession] = []

    def make(handler: Handler) -> tuple[FakeSession, Path]:
        path = tmp_path / "s.sock"
        made.append(FakeSession(path, handler))
        return made[-1], path

    yield make
    for s in made:
        s.close()


def _worker_like(frame: Frame) -> tuple[dict[str, Any], list[Any]]:
    """What the session and worker will do with a push: check, read, digest."""
    h = frame.header
    if h["op"] == "update_weights":
        validate_descriptor(h["state"])
        state = read_state(h["state"], "cpu")
        return {"ok": True, "version": 7, "digest": state_digest(state)}, []
    if h["op"] == "wait_version":
        return {"ok": True, "version": h["version"] + 1}, []
    if h["op"] == "infer":  # echo the inputs back as the output
        return {"ok": True, "version": 3, "form": h["form"], "tensors": h["tensors"]}, [
            bytes(frame.payload)
        ]
    return {"ok": False, "error": {"code": "bad_request", "message": "unknown op"}}, []


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "fc.weight": torch.randn(64, 32),
        "fc.bias": torch.randn(64).to(torch.bfloat16),
        "table": np.arange(10, dtype=np.int64),
    }


def test_update_weights_sends_the_state_by_descriptor_and_closes_it(session: Any) -> None:
    fake, path = session(_worker_like)
    state = _state()
    with Client(socket_path=path) as client:
        reply = client.update_weights("mlp", state, strict=False, timeout_s=30)
    expected = state_digest({k: torch.as_tensor(v) for k, v in state.items()})
    assert reply == {"version": 7, "digest": expected}
    header = fake.seen[-1]
    assert (header["op"], header["model"], header["strict"], header["timeout_s"]) == (
        "update_weights",
        "mlp",
        False,
        30,
    )
    assert [t["name"] for t in header["state"]["tensors"]] == list(state)
    # Closed once the reply was in: nothing of the state is left open in the client.
    assert not os.path.exists(header["state"]["path"])


def test_update_weights_raises_the_sessions_error_and_still_closes(session: Any) -> None:
    def refuse(frame: Frame) -> tuple[dict[str, Any], list[Any]]:
        error = {"code": "bad_request", "message": "unexpected key 'x'"}
        return {"ok": False, "error": error}, []

    fake, path = session(refuse)
    with Client(socket_path=path) as client, pytest.raises(BadRequestError, match="'x'"):
        client.update_weights(None, {"x": np.ones(3, np.float32)})
    assert fake.seen[-1]["strict"] is True and fake.seen[-1]["model"] is None
    assert not os.path.exists(fake.seen[-1]["state"]["path"])


def test_a_reply_without_version_or_digest_is_a_protocol_error(session: Any) -> None:
    _, path = session(lambda frame: ({"ok": True}, []))
    with Client(socket_path=path) as client:
        with pytest.raises(ProtocolError, match="lacks its version or digest"):
            client.update_weights("m", {"x": np.ones(1, np.float32)})
        with pytest.raises(ProtocolError, match="lacks its version"):
            client.wait_version("m", 1)


def test_a_state_too_big_to_describe_is_refused_before_sending(session: Any) -> None:
    fake, path = session(_worker_like)
    many = {f"layer.{i}.with.a.rather.long.name.weight": np.ones(1, np.uint8) for i in range(9000)}
    open_fds = len(os.listdir("/proc/self/fd"))
    with Client(socket_path=path) as client, pytest.raises(ClientError, match="header limit"):
        client.update_weights("m", many)
    assert fake.seen == []
    assert len(os.listdir("/proc/self/fd")) <= open_fds  # the memfd closed, nothing sent


def test_wait_version_and_min_version(session: Any) -> None:
    fake, path = session(_worker_like)
    with Client(socket_path=path) as client:
        assert client.wait_version("mlp", 4, timeout_s=2.5) == 5
        assert fake.seen[-1] == {
            "op": "wait_version",
            "model": "mlp",
            "version": 4,
            "timeout_s": 2.5,
            "id": fake.seen[-1]["id"],
        }
        out, version, _ = client.infer("mlp", np.ones((1, 3), np.float32), min_version=7)
        assert fake.seen[-1]["min_version"] == 7 and version == 3
        assert out.tolist() == [[1.0, 1.0, 1.0]]
        client.infer("mlp", np.ones((1, 3), np.float32))
        assert "min_version" not in fake.seen[-1]


def test_the_async_client_pushes_waits_and_infers(session: Any) -> None:
    fake, path = session(_worker_like)
    state = _state()

    async def main() -> tuple[dict[str, Any], int, int]:
        async with AsyncClient(socket_path=path) as client:
            reply = await client.update_weights("mlp", state, timeout_s=30)
            seen = await client.wait_version("mlp", reply["version"])
            result = await client.infer("mlp", np.zeros(2, np.float32), min_version=seen)
            return reply, seen, result.version

    reply, seen, version = asyncio.run(asyncio.wait_for(main(), 60))
    assert reply["version"] == 7 and reply["digest"].startswith("sha256:")
    assert seen == 8 and version == 3
    assert fake.seen[-1]["min_version"] == 8
    assert not os.path.exists(fake.seen[0]["state"]["path"])

"""A push names its memory by a path; the session opens nothing that could block it, and
accepts only a sealed memfd of the sending process (issue 30, items 1 and 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hotreload import Client
from hotreload.errors import BadRequestError
from tests.support import make_project

NAME = "hotreload-state-0123456789abcdef"


def one_tensor_descriptor(path: str, name: str = "inp.bias") -> dict[str, Any]:
    return {
        "kind": "memfd",
        "path": path,
        "memfd_name": NAME,
        "size": 4,
        "tensors": [
            {
                "name": name,
                "dtype": "float32",
                "shape": [1],
                "nbytes": 4,
                "via": "memfd",
                "offset": 0,
            }
        ],
    }


_OTHER = """
import json, sys, time
import numpy as np
from hotreload.protocol.shared_state import pack_state
packed = pack_state({"inp.bias": np.zeros(512, np.float32)})
print(json.dumps(packed.descriptor), flush=True)
time.sleep(60)
"""


@pytest.fixture
def served(tmp_path: Path, serve):  # type: ignore[no-untyped-def]
    config = make_project(tmp_path)
    serve(config)
    with Client(config=config, timeout_s=30) as client:
        yield config, client


def test_a_fifo_path_neither_blocks_the_session_nor_is_read(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config, client = served
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # Open for reading without a writer: a blocking open(2) of /proc/<pid>/fd/<fd> by the
    # session would wait for a writer, forever.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    answer: dict[str, Any] = {}

    def push() -> None:
        with Client(config=config, timeout_s=20) as pusher:
            try:
                pusher.call(
                    {
                        "op": "update_weights",
                        "model": "mlp",
                        "state": one_tensor_descriptor(f"/proc/{os.getpid()}/fd/{fd}"),
                    }
                )
            except Exception as exc:
                answer["error"] = exc

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)
        with Client(config=config, timeout_s=5) as other:
            assert other.ping()
        thread.join(15)
        assert isinstance(answer.get("error"), BadRequestError), answer
        assert "not the memfd" in str(answer["error"])
    finally:
        # Unblock a session that did open the FIFO, so teardown can stop it.
        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(w)
        os.close(fd)
        thread.join(15)
    assert client.status()["models"][0]["version"] == 1


def test_another_process_sealed_memfd_is_refused(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        assert other.stdout is not None
        descriptor = json.loads(other.stdout.readline())
        state = {"inp.bias": np.zeros(512, np.float32)}
        with pytest.raises(BadRequestError, match=r"not of the client \(pid"):
            client.call(
                {"op": "update_weights", "model": "mlp", "state": descriptor, "strict": False}
            )
        assert client.status()["models"][0]["version"] == 1
        # The client's own memory still goes through.
        reply = client.update_weights("mlp", state, strict=False)
        assert reply["version"] == 2
    finally:
        other.kill()
        other.wait(10)


def test_an_empty_push_is_refused_not_made_a_version(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    with pytest.raises(BadRequestError, match="holds no tensor"):
        client.update_weights("mlp", {})
    assert client.status()["models"][0]["version"] == 1

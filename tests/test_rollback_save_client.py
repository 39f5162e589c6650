"""`Client.rollback` / `Client.save` wait as long as the session's job (a big model's load
or write outlasts the client's 60 s), a number bounds the wait with a message that says the
job goes on; `hotreload rollback 2` takes a lone number as the version when the session
serves one model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import hotreload.client as client_mod
from hotreload.client import Client
from hotreload.commands.rollback import model_and_version
from hotreload.errors import BadRequestError
from hotreload.protocol.framing import Frame


class _Sock:
    def __init__(self) -> None:
        self.timeout: float | None = 65.0

    def settimeout(self, t: float | None) -> None:
        self.timeout = t


def _client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: Any) -> tuple[Client, list]:
    """A client whose socket is a stand-in: each reply is `answer(sock_timeout, header)`."""
    c = Client(socket_path=tmp_path / "s.sock", timeout_s=60.0)
    sock, sent, waits = _Sock(), [], []
    monkeypatch.setattr(c, "_conn", lambda: sock)
    monkeypatch.setattr(client_mod, "send_frame", lambda s, pieces: sent.append(pieces))

    def read(s: Any, max_bytes: int) -> Frame:
        waits.append(sock.timeout)
        return answer(sock.timeout)

    monkeypatch.setattr(client_mod, "read_frame_sync", read)
    return c, waits


def test_rollback_and_save_wait_for_the_session_not_the_clients_60_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def answer(timeout: float | None) -> Frame:
        return Frame({"id": None, "ok": True, "outcomes": [], "saved": {"folder": "x"}}, b"")

    c, waits = _client(monkeypatch, tmp_path, answer)
    c.rollback("mlp", 1)
    c.save("mlp", tmp_path / "out")
    assert waits == [None, None]  # no socket timeout: the session's deadlines bound the job


def test_a_bounded_wait_that_runs_out_says_the_job_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def answer(timeout: float | None) -> Frame:
        raise TimeoutError("timed out")

    c, waits = _client(monkeypatch, tmp_path, answer)
    with pytest.raises(TimeoutError, match=r"no answer within 2 s; the rollback goes on"):
        c.rollback("mlp", 1, timeout_s=2)
    with pytest.raises(TimeoutError, match=r"the save goes on in the session"):
        c.save("mlp", tmp_path / "out", timeout_s=2)
    assert waits == [7.0, 7.0]


class _Status:
    def __init__(self, *names: str) -> None:
        self.names = names

    def status(self) -> dict[str, Any]:
        return {"models": [{"name": n} for n in self.names]}


def test_a_lone_number_is_the_version_when_one_model_serves() -> None:
    assert model_and_version(_Status("mlp"), "2", None) == ("mlp", 2)
    assert model_and_version(_Status("mlp", "2"), "2", None) == ("2", None)  # a model "2"
    assert model_and_version(_Status("mlp", "lm"), "mlp", None) == ("mlp", None)
    assert model_and_version(_Status("mlp", "lm"), "mlp", 3) == ("mlp", 3)
    with pytest.raises(
        BadRequestError, match=r"name the model first: `hotreload rollback MODEL 2`"
    ):
        model_and_version(_Status("mlp", "lm"), "2", None)

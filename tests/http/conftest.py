"""Fixtures for the HTTP endpoint: a real session process serving KServe v2 on a free port.

Every process is stopped (then its whole group killed) at teardown by `ServeProcess.close`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ServeProcess


class HttpServeProcess(ServeProcess):
    """`hotreload serve --config PATH --http 127.0.0.1:0`: a session with its HTTP endpoint."""

    def __init__(self, config: Path, *args: str, **kwargs: Any) -> None:
        super().__init__(config, "--http", "127.0.0.1:0", *args, **kwargs)

    def _printed_url(self, prefix: str) -> str:
        self.wait_for(prefix, 60)
        for line in self.lines:
            m = re.search(re.escape(prefix) + r"(http://\S+)", line)
            if m:
                return m.group(1)
        raise AssertionError(f"no {prefix!r} URL in output:\n{self.output}")

    @property
    def url(self) -> str:
        return self._printed_url("http: listening on ")

    @property
    def metrics_url(self) -> str:
        """The metrics-only listener's /metrics URL (started with --metrics-port)."""
        return self._printed_url("http: metrics on ")

    @property
    def address(self) -> str:
        """host:port, the form tritonclient wants."""
        return self.url.removeprefix("http://")


@pytest.fixture
def http_serve(serve: Callable[..., ServeProcess]) -> Callable[..., HttpServeProcess]:
    """`http_serve(config, *args, wait_ready=True)`: the `serve` fixture (which stops and
    kills every process at teardown) with the HTTP endpoint on a free port."""

    def factory(config: Path, *args: str, wait_ready: bool = True) -> HttpServeProcess:
        return serve(config, *args, wait_ready=wait_ready, process_cls=HttpServeProcess)

    return factory


# Sessions shared by several files of this folder, one per xdist worker (the suite puts the
# tests using them on one worker: tests/conftest.py). Their tests only send requests: none
# edits, reloads or pushes to them, so each sees the session as it started, and starting
# these (a session and its workers importing torch) costs more than all their requests.


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServeProcess]:
    """The generators "chat", "lm" and "gen" of tests/http/chat_lm.py in one session."""
    from tests.http.chat_lm import chat_project
    from tests.http.shared_server import unpinned
    from tests.support import shared_server

    config = unpinned(chat_project(tmp_path_factory.mktemp("chat") / "proj"))
    with shared_server(config, process_cls=HttpServeProcess) as server:
        yield server


@pytest.fixture(scope="session")
def lm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServeProcess]:
    """One text generator, "lm" (a request may leave its model out, as lm-eval's remote
    tokenizer does), beside "plain", a model that is not one."""
    from tests.http.chat_lm import lm_project
    from tests.http.shared_server import unpinned
    from tests.support import shared_server

    config = unpinned(lm_project(tmp_path_factory.mktemp("lm") / "proj"))
    with shared_server(config, process_cls=HttpServeProcess) as server:
        yield server

"""Other local users may neither unload the model nor read the owner's tracebacks over
HTTP (issue 30, item 8), and a client reaches a live session by its socket even while the
entry file is missing (item 10)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload import Client
from hotreload.client import http_headers
from hotreload.config import load_config
from hotreload.errors import ConfigError
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request
from tests.support import make_project


def test_the_repository_routes_need_the_token_and_the_cli_finds_a_session_without_entry(
    tmp_path: Path, serve
) -> None:  # type: ignore[no-untyped-def]
    config = make_project(tmp_path)
    server = serve(config, "--http", "127.0.0.1:0", process_cls=HttpServeProcess)
    token_file = config.parent / ".hotreload" / "http_token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    for path in ("/v2/repository/models/mlp/unload", "/v2/repository/index"):
        status, headers, body = request(server.url, path, b"{}", method="POST")
        assert status == 401, body
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
        assert str(token_file) in json.loads(body)["error"]
    status, _, _ = request(
        server.url, "/v2/repository/index", b"{}", {"Authorization": "Bearer wrong"}, method="POST"
    )
    assert status == 401
    # Still serving; with the token the same route answers.
    assert request(server.url, "/v2/health/ready")[0] == 200
    status, _, body = request(
        server.url, "/v2/repository/index", b"{}", http_headers(config), method="POST"
    )
    assert status == 200 and json.loads(body)[0]["state"] == "READY"

    check_http_edges(server)
    # Issue 30, item 12: a load whose parameters are not an object is refused.
    status, _, body = request(
        server.url,
        "/v2/repository/models/mlp/load",
        b'{"parameters": []}',
        http_headers(config),
        method="POST",
    )
    assert status == 400 and "'parameters' must be a JSON object" in json.loads(body)["error"]

    # The entry file goes missing: the session still serves its last good version, and
    # the client and `hotreload reload` reach it by its socket.
    (config.parent / "model.py").rename(config.parent / "model.py.away")
    with Client(config=config, timeout_s=30) as client:
        assert client.ping()
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "reload", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert "reload FAILED" in out.stdout and out.returncode == 1, out.stdout + out.stderr


def check_http_edges(server: HttpServeProcess) -> None:
    """Issue 30, item 11: `GET /v2/` answers like `/v2`, a 405 names what is allowed (the
    `Allow` header), a malformed request gets a JSON 400 and leaves no traceback."""
    status, _, body = request(server.url, "/v2/")
    assert status == 200 and json.loads(body)["name"] == "hotreload"
    status, headers, body = request(server.url, "/v2/health/live", b"{}", method="POST")
    assert status == 405 and "GET" in headers.get("Allow", ""), headers
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, doc = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400" and b"application/json" in head, reply
    assert "malformed HTTP request" in json.loads(doc)["error"]
    assert "Traceback" not in server.output and "Error handling request" not in server.output


def test_auth_none_is_the_open_mode_and_a_bogus_mode_is_refused(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    text = config.read_text()
    config.write_text(text + '\n[http]\nauth = "none"\n')
    assert load_config(config).http.auth == "none"
    config.write_text(text + '\n[http]\nauth = "open"\n')
    with pytest.raises(ConfigError, match="auth"):
        load_config(config)
    assert load_config(make_project(tmp_path / "b")).http.auth == "token"


@pytest.mark.parametrize("sent", ["Bearer é", "Bearer 日本", "bearer  the-token ", "Basic x"])
def test_any_authorization_header_is_a_yes_or_a_no_never_an_error(sent: str) -> None:
    """compare_digest refuses a str with non-ASCII characters: a token like that raised out
    of the middleware as a bare text 500 instead of a 401."""
    from aiohttp.test_utils import make_mocked_request

    from hotreload.http.auth import authorized

    req = make_mocked_request("GET", "/v2/repository/index", headers={"Authorization": sent})
    assert authorized(req, "the-token") is (sent == "bearer  the-token ")

"""What a request body and an idle connection may cost: a body deadline (a chunk that never
arrives gets a 408), an idle keep-alive timeout, and gzip/deflate bodies inflated with the
size checked while inflating. The limits here are small so nothing waits long."""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hotreload.config import load_config
from hotreload.errors import ConfigError
from hotreload.http.body import BodyError, inflate
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import error_of, json_infer, request
from tests.support import make_project, shared_server

LIMITS = """
[http]
body_timeout_s = 1.0
keepalive_timeout_s = 1.0
max_inflated_mib = 1
"""
X = [0.5] * 64


def limited_project(tmp_path: Path) -> Path:
    config = make_project(tmp_path)
    config.write_text(config.read_text() + LIMITS)
    return config


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServeProcess]:
    """One session with the small limits for the tests that only send it requests: each
    request leaves nothing behind (a refused body closes its own connection), and the
    session's start costs far more than the requests."""
    config = limited_project(tmp_path_factory.mktemp("limits"))
    with shared_server(config, process_cls=HttpServeProcess) as server:
        yield server


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket timeout bounds the wait)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def bomb(mib: int, encoding: str = "gzip") -> bytes:
    wbits = 31 if encoding == "gzip" else 15
    co = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join([co.compress(b"\0" * 2**20) for _ in range(mib)] + [co.flush()])


def test_a_chunk_that_never_arrives_gets_408_by_the_deadline(limited: HttpServeProcess) -> None:
    server = limited
    sock = connect(server.url)
    try:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            # Within the body limit (a larger declared chunk gets 413 at once: chunk_limit.py).
            b"400\r\n" + b'{"inputs": ['
        )
        sent = time.monotonic()
        answer = read_until_closed(sock)  # closed by the server, not by our timeout
        closed_after_s = time.monotonic() - sent
    finally:
        sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"did not arrive within 1 s" in body and b"body_timeout_s" in body
    # Closed with the answer: not after aiohttp's 10 s wait for the rest of the body
    # ("lingering"), which held the connection for nothing (1 s deadline + 10 s).
    assert closed_after_s < 8, closed_after_s


def test_an_idle_keep_alive_connection_is_closed(limited: HttpServeProcess) -> None:
    server = limited
    sock = connect(server.url)
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200")


def test_tritonclient_does_not_notice_idle_connections_closing(limited: HttpServeProcess) -> None:
    server = limited
    client = httpclient.InferenceServerClient(url=server.address, network_timeout=30)
    try:
        x = np.full((1, 64), 0.5, dtype=np.float32)
        inp = httpclient.InferInput("input", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        first = client.infer("mlp", [inp]).as_numpy("output")
        time.sleep(2.5)  # past the 1 s idle timeout: the pooled connection is gone
        again = client.infer("mlp", [inp]).as_numpy("output")
        assert np.array_equal(first, again)
    finally:
        client.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_bombs_are_refused_while_inflating_and_good_bodies_pass(
    limited: HttpServeProcess, encoding: str
) -> None:
    server = limited
    path = "/v2/models/mlp/infer"
    plain = json_infer(X, [1, 64], name="input")
    status, _, want = request(server.url, path, plain)
    assert status == 200
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    status, _, got = request(server.url, path, packed, {"Content-Encoding": encoding})
    assert status == 200 and json.loads(got)["outputs"] == json.loads(want)["outputs"]

    status, headers, body = request(
        server.url, path, bomb(64, encoding), {"Content-Encoding": encoding}
    )
    assert status == 413, body
    assert f"inflates to more than {2**20} bytes ({encoding})" in error_of(body)
    assert "max_inflated_mib" in error_of(body) and headers.get("Connection") == "close"
    # The session serves on.
    assert request(server.url, path, plain)[0] == 200


def test_odd_encodings_and_broken_bodies(limited: HttpServeProcess) -> None:
    server = limited
    path = "/v2/models/mlp/infer"
    status, _, body = request(server.url, path, b"x", {"Content-Encoding": "br"})
    assert status == 415 and "send gzip, deflate or none" in error_of(body)
    status, _, body = request(server.url, path, b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "not valid gzip" in error_of(body)
    cut = gzip.compress(json_infer(X, [1, 64], name="input"))[:-12]
    status, _, body = request(server.url, path, cut, {"Content-Encoding": "gzip"})
    assert status == 400 and "cut short" in error_of(body)


def test_inflate_stops_at_the_limit_and_reads_several_gzip_members() -> None:
    with pytest.raises(BodyError, match="inflates to more than 1000 bytes"):
        inflate(bomb(8), "gzip", 1000)
    two = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert inflate(two, "gzip", 100) == b"abcd"
    assert inflate(zlib.compress(b"x" * 100)[2:-4], "deflate", 100) == b"x" * 100  # raw


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("body_timeout_s = 0", "http.body_timeout_s"),
        ("keepalive_timeout_s = -1", "http.keepalive_timeout_s"),
        ("max_inflated_mib = 0", "http.max_inflated_mib"),
        ("body_timeout = 5", "did you mean 'body_timeout_s'?"),
    ],
)
def test_http_limit_keys_are_checked(tmp_path: Path, line: str, message: str) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text() + f"\n[http]\n{line}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(config)


def test_a_chunked_body_over_the_limit_gets_413_before_it_is_all_sent(
    tmp_path: Path, http_serve
) -> None:
    """Chunks of 64 KiB against a 1 MiB limit: the 17th chunk's size line alone, with none
    of its bytes (the body so far is exactly the limit), gets the 413 at once, and the
    connection closes; the other 23 chunks are never sent. (The body deadline is 60 s; a
    late answer fails on the socket's 30 s timeout.)"""
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("[[models]]", "max_frame_mib = 1\n[[models]]", 1))
    server = http_serve(config)
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    sock = connect(server.url)
    try:
        sock.sendall(head)
        for _ in range(16):
            sock.sendall(chunk)  # 1 MiB: at the limit, not past it
        sock.sendall(b"10000\r\n")
        answer = read_until_closed(sock)
    finally:
        sock.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413"), answer[:300]
    message = json.loads(body)["error"]
    assert "declares at least 1114112 bytes, over the 1048576-byte limit" in message
    # A chunked body within the limit is served, and so is the request after it.
    doc = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": X}]}
    )
    half = len(doc) // 2
    sock = connect(server.url)
    try:
        sock.sendall(head)
        for part in (doc[:half], doc[half:]):
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part.encode()))
        sock.sendall(
            b"0\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 200") == 2, answer[:300]



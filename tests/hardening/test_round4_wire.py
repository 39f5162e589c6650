"""One request can cost its own answer, never the worker or the log (issue 38, items 2, 6,
7, 8): a reply too large for a frame header travels in the payload, or is refused with a
400 when it passes the frame limit; a reply the session cannot read fails that request
alone; a client that hangs up mid-body costs one log line; text-route inputs out of range
get a 400 naming the field; a socket client silent in the middle of a frame is dropped;
`watch --http` with a full state folder says so in one line."""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotreload import paths
from hotreload.cli import main as cli_main
from hotreload.engine.endpoint import Endpoint
from hotreload.errors import ProtocolError
from hotreload.exitcodes import EXIT_OK
from hotreload.protocol.frame_protocol import FrameProtocol
from hotreload.protocol.framing import (
    MAX_HEADER_BYTES,
    SPILLED_HEADER,
    Frame,
    pack_frame,
    pack_spilling,
    read_frame_sync,
    unpack_body,
    unspill,
)
from tests.evalharness.make_lm import served_project
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request
from tests.support import SHARED, count_events, make_project, wait_until

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

#: The tiny LM's context (GPT-2 `n_positions`) and vocabulary (its tokenizer's size).
CONTEXT, VOCAB = 512, 400
#: Tokens per prompt of the echoed-logprobs requests: within the context, with one new token.
PROMPT_TOKENS = 500


def post(url: str, path: str, doc: Any) -> tuple[int, Any]:
    status, _, body = request(
        url, path, json.dumps(doc).encode(), {"Content-Type": "application/json"}, timeout=120
    )
    return status, json.loads(body)


class LmServer(HttpServeProcess):
    """The session, and its worker's pids once it served (a death would change them)."""

    pids: list[int]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmServer]:
    """One session for the module, serving the tiny LM with frames of at most 2 MiB
    (max_frame_mib = 1, plus the MiB a frame's header may take)."""
    config = served_project(tmp_path_factory.mktemp("round4") / "proj")
    config.write_text("max_frame_mib = 1\n" + config.read_text())
    server = LmServer(config)
    SHARED.add(server.proc.pid)
    try:
        server.wait_ready(120)
        server.pids = server.worker_pids()
        yield server
    finally:
        SHARED.discard(server.proc.pid)
        server.close()


def assert_worker_lived(server: LmServer) -> None:
    assert server.worker_pids() == server.pids
    assert count_events(server.config, "worker_died") == 0
    status, doc = post(server.url, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    assert status == 200, doc


# ---------------------------------------------------------------------------- item 2


def test_a_reply_too_large_for_a_header_travels_in_the_payload(lm: LmServer) -> None:
    # 300 000 token ids: a 1.2 MB reply header, over the 1 MiB a frame header may take.
    status, doc = post(lm.url, "/tokenize", {"model": "lm", "prompt": "x" * 300_000})
    assert status == 200, doc
    assert doc["count"] == 300_000 and len(json.dumps(doc["tokens"])) > MAX_HEADER_BYTES
    # Echoed prompts with 20 logprobs per token, each prompt within the context.
    prompts = [[(7 * p + i) % VOCAB for i in range(PROMPT_TOKENS)] for p in range(7)]
    ask = {"model": "lm", "prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 20}
    status, doc = post(lm.url, "/v1/completions", ask)
    assert status == 200, doc
    assert len(json.dumps(doc["choices"], separators=(",", ":"))) > MAX_HEADER_BYTES
    assert [len(c["logprobs"]["top_logprobs"]) for c in doc["choices"]] == [501] * 7
    assert_worker_lived(lm)


def test_a_reply_over_the_frame_limit_is_a_400_and_the_worker_lives(
    lm: LmServer,
) -> None:
    prompts = [[(3 * p + i) % VOCAB for i in range(PROMPT_TOKENS)] for p in range(16)]
    ask = {"model": "lm", "prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 20}
    status, doc = post(lm.url, "/v1/completions", ask)
    assert status == 400, doc
    said = doc["error"]["message"]  # /v1 answers OpenAI error objects
    assert "frame limit" in said and "max_frame_mib" in said, doc
    assert_worker_lived(lm)


def test_a_reply_whose_header_cannot_be_read_fails_alone() -> None:
    # What the session reads its workers with: a whole frame it cannot read is reported by
    # its id, and the frames around it are read on (before: the channel broke, and the
    # session killed the worker).
    async def main() -> None:
        got: list[Frame] = []
        bad: list[ProtocolError] = []
        errors: list[Exception] = []
        a, b = socket.socketpair()
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_unix_connection(
            lambda: FrameProtocol(
                4 << 20, got.append, on_error=errors.append, on_unreadable=bad.append
            ),
            sock=a,
        )
        huge = json.dumps({"id": 2, "ok": True, "tokens": [1] * (MAX_HEADER_BYTES // 2)})
        not_json = '{"id":3,"ok":tru'
        with b:
            stream = _raw({"id": 1}) + _raw_head(huge) + _raw_head(not_json) + _raw({"id": 4})
            sending = asyncio.create_task(asyncio.to_thread(b.sendall, stream))
            await asyncio.wait_for(_until(lambda: len(got) == 2 and len(bad) == 2), 10)
            await asyncio.wait_for(sending, 10)
            assert [f.header["id"] for f in got] == [1, 4]
            assert [getattr(e, "request_id", None) for e in bad] == [2, 3]
            assert f"at most {MAX_HEADER_BYTES} bytes" in str(bad[0])
            assert not errors and not proto.closed

    asyncio.run(main())


def test_a_spilled_header_comes_back_whole_or_fails_by_its_id() -> None:
    header = {"id": 9, "ok": True, "tokens": list(range(300_000))}
    pieces = pack_spilling(header, [b"tail"])
    body = b"".join(bytes(p) for p in pieces)[4:]
    frame = unpack_body(body)
    assert set(frame.header) == {"id", SPILLED_HEADER}
    whole = unspill(frame)
    assert whole.header == header and bytes(whole.payload) == b"tail"
    cut = Frame(frame.header, bytes(frame.payload)[:100])
    with pytest.raises(ProtocolError, match="cannot be read") as err:
        unspill(cut)
    assert getattr(err.value, "request_id", None) == 9
    small = {"id": 1, "ok": True}
    assert unpack_body(b"".join(bytes(p) for p in pack_spilling(small))[4:]).header == small


# ---------------------------------------------------------------------------- item 8


BAD_TEXT = [
    ("/v1/completions", {"prompt": [5, VOCAB]}, "'prompt' holds token id 400"),
    ("/v1/completions", {"prompt": [[5, 6], [5, 10**6]]}, "'prompt'[1] holds token id"),
    ("/v1/completions", {"prompt": [5, 2**80]}, "'prompt' holds token id"),
    ("/detokenize", {"tokens": [5, VOCAB + 7]}, "'tokens' holds token id 407"),
    ("/v1/completions", {"prompt": "a\ud800b"}, "'prompt' holds a lone surrogate"),
    ("/v1/completions", {"prompt": ["ok", "\udfff"]}, "'prompt'[1] holds a lone surrogate"),
    ("/tokenize", {"prompt": "a\ud800"}, "'prompt' holds a lone surrogate"),
    ("/v2/models/lm/generate", {"text_input": "\ud800"}, "'text_input' holds a lone"),
    ("/v1/completions", {"prompt": "x", "seed": 2**80}, "'seed' must be an integer from"),
    ("/v1/completions", {"prompt": "x", "best_of": True}, "'best_of' must be 1"),
    ("/v1/completions", {"prompt": "x", "n": True}, "'n' must be an integer from 1 to 128"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": False}, "'presence_penalty'"),
]


@pytest.mark.parametrize("path, body, says", BAD_TEXT)
def test_text_inputs_out_of_range_get_a_400_naming_the_field(
    lm: LmServer, path: str, body: dict[str, Any], says: str
) -> None:
    status, doc = post(lm.url, path, body if path.startswith("/v2") else {"model": "lm", **body})
    # The KServe v2 routes answer {"error": "..."}; the OpenAI-style ones OpenAI's object.
    said = doc["error"] if path.startswith("/v2") else doc["error"]["message"]
    assert status == 400 and says in said, doc
    assert_worker_lived(lm)


def test_seeds_torch_takes_and_a_plain_1_still_answer(lm: LmServer) -> None:
    ok = {"prompt": "x", "seed": 2**64 - 1, "n": 1, "best_of": 1, "max_tokens": 1}
    assert post(lm.url, "/v1/completions", ok)[0] == 200
    ok = {"prompt": "x", "seed": -(2**63), "presence_penalty": 0, "max_tokens": 1}
    assert post(lm.url, "/v1/completions", ok)[0] == 200


def test_an_adapter_of_a_model_without_adapters_is_refused(lm: LmServer) -> None:
    status, doc = post(lm.url, "/v1/completions", {"model": "lm:nope", "prompt": "x"})
    assert status == 400 and "'lm' has no adapters" in doc["error"]["message"], doc
    status, doc = post(lm.url, "/v1/completions", {"model": "lm", "adapter": "a", "prompt": "x"})
    assert status == 400 and "no adapter 'a'" in doc["error"]["message"], doc
    # "base" names the base weights, which a model without adapters has.
    assert post(lm.url, "/v1/completions", {"model": "lm:base", "prompt": "x"})[0] == 200


def test_a_socket_client_silent_inside_a_frame_is_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def ping(header: dict[str, Any], payload: Any) -> tuple[dict[str, Any], list[Any]]:
        return {"ok": True}, []

    folder = Path(tempfile.mkdtemp(prefix="hr-round4-"))
    path = folder / "run" / "s.sock"

    async def main() -> tuple[dict[str, Any], dict[str, Any], bytes]:
        endpoint = Endpoint(path, {"ping": ping}, 1 << 20, partial_frame_timeout_s=0.5)
        await endpoint.start()
        try:
            return await asyncio.to_thread(clients)
        finally:
            await endpoint.close()

    def clients() -> tuple[dict[str, Any], dict[str, Any], bytes]:
        with socket.socket(socket.AF_UNIX) as slow, socket.socket(socket.AF_UNIX) as silent:
            for s in (slow, silent):
                s.settimeout(10)
                s.connect(str(path))
            frame = b"".join(bytes(p) for p in pack_frame({"op": "ping", "id": 1}))
            silent.sendall(frame[:6])
            # A frame sent in pieces, each within the timeout, is read whole.
            for i in range(0, len(frame), 4):
                slow.sendall(frame[i : i + 4])
                time.sleep(0.05)
            answered = read_frame_sync(slow, 1 << 20).header
            dropped = read_frame_sync(silent, 1 << 20).header
            return answered, dropped, silent.recv(10)

    try:
        answered, dropped, after = asyncio.run(main())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert answered == {"ok": True, "id": 1}
    assert dropped["error"]["code"] == "bad_request"
    assert "sent 6 bytes of a frame, then nothing for 0.5 s" in dropped["error"]["message"]
    assert after == b""  # closed
    lines = [x for x in capsys.readouterr().err.splitlines() if "socket client dropped" in x]
    assert len(lines) == 1, lines


# ---------------------------------------------------------------------------- item 7


def test_a_client_that_hangs_up_mid_body_costs_one_line(lm: LmServer) -> None:
    host, port = lm.url.removeprefix("http://").split(":")
    for path in ("/v1/completions", "/v2/models/lm/infer", "/tokenize"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 100000\r\n\r\n".encode()
                + b'{"prompt": "'
            )
            time.sleep(0.2)
    said = "closed the connection before the end of its body of 100000 bytes"
    wait_until(lambda: sum(said in x for x in lm.lines) >= 3, 30, what=said)
    time.sleep(0.5)  # anything it would print after that line
    assert sum(said in x for x in lm.lines) == 3
    assert "Traceback" not in lm.output, lm.output


# ---------------------------------------------------------------------------- item 6


def test_watch_http_with_a_full_state_folder_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_project(tmp_path)
    write = paths.write_private_file

    def full(path: Path, text: str) -> None:
        if path.name == paths.HTTP_TOKEN_FILE:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, text)

    monkeypatch.setattr(paths, "write_private_file", full)
    code = cli_main(["watch", "--no-tui", "--config", str(config), "--http", "127.0.0.1:0"])
    out = capsys.readouterr()
    assert code != EXIT_OK
    said = [x for x in out.err.splitlines() if "cannot write the HTTP token file" in x]
    assert len(said) == 1 and "No space left on device" in said[0], out.err
    assert 'auth = "none"' in said[0]
    assert "Traceback" not in out.out + out.err


def _raw(header: dict[str, Any]) -> bytes:
    return b"".join(bytes(p) for p in pack_frame(header))


def _raw_head(head: str) -> bytes:
    """A frame whose header is `head` as it is, valid JSON or not."""
    data = head.encode()
    return struct.pack(">II", 4 + len(data), len(data)) + data


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)

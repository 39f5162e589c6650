"""Streamed answers (`"stream": true`, Server-Sent Events) against a live session: the
`openai` client reads the deltas of the answer the model gives whole (compared with the
same weights called in this process), the usage chunk OpenAI sends with
`stream_options.include_usage` and none without, every chunk naming the weights that wrote
it. A client that hangs up stops its decoding at once; a reload past its drain deadline
ends a stream with an error the client's SDK raises, naming the reload. (LiteLLM reading a
streamed chat and its usage chunk: tests/http/test_openai_clients.py, in the one LiteLLM
process that file starts.)

Two generators in one session: "lm" (a tiny GPT-2 with a byte-level BPE tokenizer,
tests/evalharness/make_lm.py) and "count" (tests/stream_lm.py: an answer of exactly
`max_tokens` tokens, 10 ms a token, a 4 s request timeout and a 0.5 s drain deadline).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotreload.client import http_headers
from hotreload.config import load_config
from hotreload.engine.router import ModelRouter
from hotreload.engine.worker_proc import WorkerProcess
from hotreload.errors import RequestTimeoutError
from hotreload.protocol.messages import LoadRequest, StatusRequest, SwapRequest
from hotreload.protocol.ops import WorkerOp
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request
from tests.stream_lm import count_lm, count_project, count_section
from tests.support import SHARED, import_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from tests.evalharness.make_lm import served_project  # noqa: E402

PROMPT = "The capital of France is"


class StreamServer(HttpServeProcess):
    model: Any
    tok: Any


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamServer]:
    config = served_project(tmp_path_factory.mktemp("stream") / "proj")
    (config.parent / "count_lm.py").write_text(count_lm(0.01))
    config.write_text(config.read_text() + count_section(timeout_s=4.0, drain_s=0.5))
    server = StreamServer(config)
    SHARED.add(server.proc.pid)
    try:
        server.wait_ready(180)
        folder = config.parent / "lm"
        server.model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        server.tok = transformers.AutoTokenizer.from_pretrained(folder)
        yield server
    finally:
        SHARED.discard(server.proc.pid)
        server.close()


def client_of(server: StreamServer) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_text(server: StreamServer, prompt: str, n: int) -> str:
    """The model's greedy answer, in this process: the whole sequence run again per token
    (no cache: nothing shared with the server's decode loop), to the end-of-text token."""
    ids = server.tok(prompt).input_ids
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            nxt = int(server.model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == server.tok.eos_token_id:
                break
            out.append(nxt)
    return server.tok.decode(out)


def post(url: str, doc: Any) -> tuple[int, dict[str, str], bytes]:
    return request(
        url,
        "/v1/completions",
        json.dumps(doc).encode(),
        {"Content-Type": "application/json"},
        timeout=60,
    )


def events(body: bytes) -> list[Any]:
    """The data of each Server-Sent Event, parsed ("[DONE]" as is)."""
    assert body.endswith(b"\n\n"), body[-80:]
    out = []
    for block in body.decode().split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_openai_streams_the_answer_it_gives_whole(server: StreamServer) -> None:
    client = client_of(server)
    want = greedy_text(server, PROMPT, 12)
    whole = client.completions.create(model="lm", prompt=PROMPT, max_tokens=12, temperature=0)
    assert whole.choices[0].text == want
    chunks = list(
        client.completions.create(
            model="lm",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *texts, usage = chunks
    # The first text goes at once, the rest after (the worker groups the tokens made within
    # 10 ms of a frame): streamed, not the answer in one piece.
    head = texts[0].choices[0].text
    assert len(texts) >= 2 and 0 < len(head) < len(want) and want.startswith(head)
    assert "".join(c.choices[0].text for c in texts) == want
    finishes = [c.choices[0].finish_reason for c in texts]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    # OpenAI's usage chunk: no choices, the counts of the whole answer; every other chunk
    # carries `usage: null`.
    assert usage.choices == [] and usage.usage == whole.usage
    assert all(c.usage is None for c in texts)
    assert {c.system_fingerprint for c in chunks} == {whole.system_fingerprint}
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "text_completion"

    # A stop string is cut as it is from the whole answer, even when tokens split it.
    stop = want[3:6]
    cut = client.completions.create(
        model="lm", prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop], stream=True
    )
    pieces = list(cut)
    assert "".join(c.choices[0].text for c in pieces) == want[: want.index(stop)]
    assert pieces[-1].choices[0].finish_reason == "stop"

    # Two prompts, two greedy choices each: every choice streams its own text, in its index.
    prompts = [PROMPT, "One, two"]
    whole = client.completions.create(model="lm", prompt=prompts, n=2, max_tokens=6, temperature=0)
    streamed: dict[int, str] = {}
    for c in client.completions.create(
        model="lm", prompt=prompts, n=2, max_tokens=6, temperature=0, stream=True
    ):
        for choice in c.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {c.index: c.text for c in whole.choices}
    assert streamed[0] == greedy_text(server, PROMPT, 6)


def test_the_event_stream_as_sent(server: StreamServer) -> None:
    """Without include_usage no chunk has a usage field; the stream is text/event-stream
    and ends with [DONE]; the version headers name the version that wrote it."""
    doc = {"model": "lm", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True}
    status, headers, body = post(server.url, doc)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    *chunks, done = events(body)
    assert done == "[DONE]" and chunks
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
    assert {c["system_fingerprint"] for c in chunks} == {headers["X-Hotreload-Digest"]}
    assert {str(c["model_version"]) for c in chunks} == {headers["X-Hotreload-Version"]}


def test_chat_streams_deltas_of_the_answer_it_gives_whole(server: StreamServer) -> None:
    """A chat streams `chat.completion.chunk`s: the role first, then the content's pieces,
    then the finish_reason; the pieces make the answer not streamed, which is the model's
    own greedy answer to the template's text, worked out in this process."""
    import jinja2

    module = import_file(server.config.parent / "count_lm.py", "hr_stream_count_lm")
    messages = [{"role": "system", "content": "Go:"}, {"role": "user", "content": "ab"}]
    text = jinja2.Template(module.CHAT_TEMPLATE).render(messages=messages)
    ids, model = module.encode(text), module.build()
    with torch.inference_mode():
        for _ in range(5):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    want = module.decode(ids[-5:])

    client = client_of(server)
    ask: dict[str, Any] = {"model": "count", "messages": messages, "max_tokens": 5}
    whole = client.chat.completions.create(**ask, temperature=0)
    assert whole.choices[0].message.content == want
    chunks = list(
        client.chat.completions.create(
            **ask, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    *deltas, usage = chunks
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == want
    assert [c.choices[0].finish_reason for c in deltas][-1] == "length"
    assert usage.choices == [] and usage.usage == whole.usage
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.system_fingerprint for c in chunks} == {whole.system_fingerprint}


def test_openai_streams_logprobs_that_add_up_to_the_answers(server: StreamServer) -> None:
    """`logprobs` streamed, read by the `openai` client: each chunk's are those of the
    tokens it brings, and together they are the list of the answer not streamed, in the
    legacy shape (completions, a byte-level tokenizer whose text goes at each token) and
    the chat shape (a model's own tokenizer, its text a token behind)."""
    client = client_of(server)
    ask: dict[str, Any] = {"model": "lm", "prompt": PROMPT, "max_tokens": 12, "logprobs": 2}
    whole = client.completions.create(**ask, temperature=0).choices[0].logprobs
    chunks = list(client.completions.create(**ask, temperature=0, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(parts) > 1  # streamed, not all at the end
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in getattr(p, field)] == getattr(whole, field), field

    messages = [{"role": "user", "content": "ab"}]
    chat: dict[str, Any] = {"model": "count", "messages": messages, "max_tokens": 5}
    chat.update(logprobs=True, top_logprobs=2, temperature=0)
    want = client.chat.completions.create(**chat).choices[0].logprobs.content
    streamed = list(client.chat.completions.create(**chat, stream=True))
    got = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [e.model_dump() for e in got] == [e.model_dump() for e in want]
    assert len(want) == 5


BAD_STREAMS = [
    ({"stream": "yes"}, "'stream' must be true or false", "stream"),
    ({"stream_options": {"include_usage": True}}, "only allowed with 'stream': true", None),
    ({"stream": True, "stream_options": {"usage": True}}, "has no field 'usage'", None),
    ({"stream": True, "prompt": "x " * 600}, "maximum context length is 512", None),
]


@pytest.mark.parametrize(("extra", "says", "param"), BAD_STREAMS)
def test_a_bad_stream_request_is_a_400_before_any_event(
    server: StreamServer, extra: dict[str, Any], says: str, param: str | None
) -> None:
    """Found before the first token (the prompt past the context too): a JSON error with
    its status, as the same request not streamed gets, not an event stream."""
    doc = {"model": "lm", "prompt": PROMPT, "max_tokens": 4, **extra}
    status, headers, body = post(server.url, doc)
    assert status == 400 and headers["Content-Type"].startswith("application/json"), body
    error = json.loads(body)["error"]
    assert says in error["message"], error
    if param is not None:
        assert error["param"] == param


def test_a_client_hanging_up_stops_its_decoding(server: StreamServer) -> None:
    """900 tokens at 10 ms hold the serving thread 9 s; the client reads two and hangs up.
    The next request is answered, not timed out after the model's 4 s request timeout
    (a 504): the stream stopped at its next token."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    doc = {"model": "count", "prompt": "a", "max_tokens": 900, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(doc), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    got = b""
    while got.count(b"\n\n") < 2:
        got += resp.read1(4096)
    conn.sock.close()  # hang up mid-stream
    conn.close()
    status, _, body = post(
        server.url, {"model": "count", "prompt": "a", "max_tokens": 3, "temperature": 0}
    )
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == "bcd"


def test_a_reload_past_the_drain_deadline_ends_the_stream_naming_it(server: StreamServer) -> None:
    """A stream of 9 s meets a reload whose drain deadline is 0.5 s: the SDK raises the
    error event, which names the reload; the reload goes on, and the next stream is the
    new version's."""
    client = client_of(server)
    code = server.config.parent / "count_lm.py"
    stream = client.completions.create(
        model="count", prompt="a", max_tokens=900, temperature=0, stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].text == "b" and first.model_version == 1
    code.write_text(code.read_text() + "\n# an edit\n")
    token = http_headers(server.config)
    reloaded: list[tuple[int, bytes]] = []

    def load() -> None:
        status, _, body = request(
            server.url, "/v2/repository/models/count/load", b"{}", token, timeout=120
        )
        reloaded.append((status, body))

    loader = threading.Thread(target=load)
    loader.start()
    with pytest.raises(openai.APIError, match="stream ended: model reloading to v2"):
        for chunk in stream:
            assert chunk.model_version == 1  # never a token of the new version
    loader.join(120)
    assert reloaded and reloaded[0][0] == 200, reloaded
    after = list(
        client.completions.create(
            model="count", prompt="a", max_tokens=3, temperature=0, stream=True
        )
    )
    assert {c.model_version for c in after} == {2}
    assert "".join(c.choices[0].text for c in after) == "bcd"


# ------------------------------------------------------------ text requests not streamed


def test_a_text_request_past_its_timeout_frees_the_real_worker(tmp_path: Path) -> None:
    """A chat without max_tokens on the counting LM decodes 1024 tokens (it states no
    context) at 20 ms each: 20 s of the serving thread. Its 0.5 s timeout passes; the
    router's CANCEL stops it at its next token (the worker counts it), and the next request
    is answered within its own wait, not after the 20 s."""
    config = load_config(count_project(tmp_path, delay_s=0.02))

    async def run() -> tuple[BaseException | None, str, int]:
        worker = WorkerProcess(config.models[0], config, 1)
        await worker.start(120.0)
        try:
            await worker.load(LoadRequest(1), 120.0)
            await worker.swap(SwapRequest(), 30.0)
            router = ModelRouter("count", 8, 60.0, 1, worker=worker)
            router.version = 1
            router.open_gate()
            chat = {
                "task": "chat",
                "messages": [{"role": "user", "content": "a"}],
                "sampling": {"max_tokens": None, "temperature": 0.0},
            }
            long = router.submit_future({"op": WorkerOp.TEXT, "text": chat, "timeout_s": 0.5}, b"")
            error: BaseException | None = None
            try:
                await asyncio.wait_for(long, 60.0)
            except RequestTimeoutError as exc:
                error = exc
            short = {**chat, "sampling": {"max_tokens": 3, "temperature": 0.0}}
            # 10 s: far less than the 20 s the first request would still decode.
            reply = await asyncio.wait_for(
                router.submit_future({"op": WorkerOp.TEXT, "text": short}, b""), 10.0
            )
            status = await worker.status(StatusRequest(), 30.0)
            return error, reply.header["choices"][0]["text"], status.cancelled
        finally:
            await worker.end(5.0)

    error, text, cancelled = asyncio.run(run())
    assert isinstance(error, RequestTimeoutError) and "inside the worker" in str(error)
    assert text == "bcd" and cancelled == 1


def requests_counted(server: StreamServer, outcome: str) -> float:
    """The session's /metrics count of the count model's requests that ended `outcome`."""
    _, _, body = request(server.url, "/metrics")
    for line in body.decode().splitlines():
        ours = 'model="count"' in line and f'outcome="{outcome}"' in line
        if line.startswith("hotreload_requests_total{") and ours:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_hanging_up_stops_a_chat_not_streamed(server: StreamServer) -> None:
    """A chat without max_tokens (the SDK and Open WebUI leave it out) on the counting LM:
    1024 tokens at 10 ms, past the model's 4 s request timeout. The client hangs up after
    it was sent; the session stops it in the worker then, not at its timeout: once the next
    request's success is counted, no timeout is (an expiry would have come first: the
    serving thread answers in order)."""
    timed_out = requests_counted(server, "timed_out")
    ok = requests_counted(server, "success")
    host, port = server.url.removeprefix("http://").split(":")
    doc = {"model": "count", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        body = json.dumps(doc).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # a second of decoding, then the client gives up
    status, _, reply = post(
        server.url, {"model": "count", "prompt": "a", "max_tokens": 3, "temperature": 0}
    )
    assert status == 200 and json.loads(reply)["choices"][0]["text"] == "bcd"
    for _ in range(100):  # the figures /metrics reads are published a moment later
        if requests_counted(server, "success") > ok:
            break
        time.sleep(0.1)
    assert requests_counted(server, "success") > ok
    assert requests_counted(server, "timed_out") == timed_out


def test_a_context_too_long_names_its_field_as_param(server: StreamServer) -> None:
    """The worker's 400 for a prompt past the context names the field its message names,
    as the OpenAI error object's `param` (it was null)."""
    doc = {"model": "lm", "prompt": "a " * 2000, "max_tokens": 4}
    status, _, body = post(server.url, doc)
    error = json.loads(body)["error"]
    assert status == 400 and "maximum context length" in error["message"], body
    assert error["param"] == "prompt", error


@pytest.mark.parametrize(
    ("path", "openai_shape"),
    [("/v1/completions", True), ("/tokenize", True), ("/v2/models/lm/infer", False)],
)
def test_a_malformed_request_gets_its_routes_error_shape(
    server: StreamServer, path: str, openai_shape: bool
) -> None:
    """A request aiohttp cannot parse (a header without a colon) on an OpenAI-style path is
    answered with OpenAI's error object, as that path's other errors are; KServe's keep
    `{"error": "<message>"}`."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, doc = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400" and b"application/json" in head, reply
    error = json.loads(doc)["error"]
    if openai_shape:
        assert error["type"] == "invalid_request_error" and error["param"] is None
        assert error["message"].startswith("malformed HTTP request"), error
    else:
        assert isinstance(error, str) and error.startswith("malformed HTTP request")

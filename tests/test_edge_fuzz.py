"""Odd input at the edges: every header field of the wrong type gets a `bad_request` reply
naming the field, and property-based tests (hypothesis) show that nothing raises past the
frame parser, the header check or the KServe request parser."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotreload.errors import ProtocolError
from hotreload.http.kserve import InferRequestError, parse_infer_request
from hotreload.paths import socket_path_for
from hotreload.protocol.frame_protocol import FrameParser
from hotreload.protocol.framing import read_frame_sync
from hotreload.protocol.header_fields import FIELD_TYPES, header_problem
from tests.support import ServeProcess

#: Any JSON value (what json.loads can give a field).
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from([*FIELD_TYPES, "other"])
# No "reload": a valid one really reloads, which would make the run long, not wiser.
OPS = st.sampled_from(["infer", "status", "ping", "nope"]) | JSON
HEADERS = st.fixed_dictionaries({"op": OPS}, optional={"id": JSON}) | st.dictionaries(
    FIELDS, JSON, max_size=5
)
_FRAME_PREFIX = struct.Struct(">II")


def raw_frame(head: bytes, payload: bytes = b"") -> bytes:
    return _FRAME_PREFIX.pack(4 + len(head) + len(payload), len(head)) + head + payload


class RawConnection:
    """A client socket that sends frames as given and reads replies, with a timeout."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(str(path))

    def ask(self, data: bytes) -> dict[str, Any]:
        self.sock.sendall(data)
        return read_frame_sync(self.sock, 1 << 24).header

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------- live socket


@pytest.fixture
def session(project: Path, serve: ServeProcess.Factory) -> Path:
    serve(project)
    return socket_path_for(project)


@pytest.mark.parametrize(
    ("header", "field", "expected"),
    [
        ({"op": []}, "op", "an op name (a string), got a list"),
        ({"op": {}}, "op", "an op name (a string), got an object"),
        ({"op": 7}, "op", "got a number"),
        ({"op": "infer", "model": ["mlp"], "tensors": []}, "model", "a model name"),
        ({"op": "reload", "model": {"name": "mlp"}}, "model", "got an object"),
        ({"op": "infer", "model": "mlp", "tensors": {}}, "tensors", "a list of"),
        ({"op": "infer", "model": "mlp", "tensors": [], "timeout_s": "5"}, "timeout_s", "number"),
        ({"op": "reload", "trigger": 3}, "trigger", "a string or null"),
        ({"op": "status", "id": [1]}, "id", "an integer, a string or null"),
    ],
)
def test_a_field_of_the_wrong_type_gets_bad_request_and_the_connection_serves_on(
    session: Path, header: dict[str, Any], field: str, expected: str
) -> None:
    conn = RawConnection(session)
    try:
        reply = conn.ask(raw_frame(json.dumps(header).encode()))
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
        assert f"'{field}'" in reply["error"]["message"]
        assert expected in reply["error"]["message"]
        # The frame was whole: the stream is still in step and the next request is answered.
        again = conn.ask(raw_frame(b'{"op":"ping","id":5}'))
        assert again["ok"] is True and again["id"] == 5
    finally:
        conn.close()


def test_a_wrong_dtype_type_inside_tensors_is_a_bad_request(session: Path) -> None:
    conn = RawConnection(session)
    try:
        head = {"op": "infer", "id": 1, "model": "mlp"}
        head["tensors"] = [{"name": "x", "dtype": ["float32"], "shape": [1], "nbytes": 4}]
        reply = conn.ask(raw_frame(json.dumps(head).encode(), b"\0" * 4))
        assert reply["error"]["code"] == "bad_request" and "unsupported dtype" in str(reply)
    finally:
        conn.close()


def test_fuzzed_headers_always_get_an_answer(session: Path) -> None:
    conn = RawConnection(session)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(HEADERS)
    def answered(header: dict[str, Any]) -> None:
        reply = conn.ask(raw_frame(json.dumps(header).encode()))
        assert isinstance(reply.get("ok"), bool), reply
        if not reply["ok"]:
            assert reply["error"]["code"] != "error", reply  # never the generic "a bug" code

    try:
        answered()
        assert conn.ask(raw_frame(b'{"op":"ping"}'))["ok"] is True
    finally:
        conn.close()


# ---------------------------------------------------------------------- parsers alone


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(min_value=4, max_value=256))
def test_the_frame_parser_raises_nothing_but_protocol_errors(
    chunks: list[bytes], max_bytes: int
) -> None:
    parser = FrameParser(max_bytes)
    for chunk in chunks:
        try:
            frames = parser.feed(chunk)
        except ProtocolError:
            return  # the stream is broken from here on: the endpoint answers and hangs up
        assert all(isinstance(f.header, dict) for f in frames)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.sampled_from([b"[" * 5000, b'{"a":' + b"9" * 5000 + b"}"]))
def test_the_frame_parser_turns_unreadable_headers_into_protocol_errors(head: bytes) -> None:
    parser = FrameParser(1 << 20)
    try:
        frames = parser.feed(raw_frame(head))
    except ProtocolError:
        return
    assert len(frames) == 1 and isinstance(frames[0].header, dict)


@given(st.dictionaries(FIELDS, JSON, max_size=6))
def test_the_header_check_names_a_field_or_passes_only_good_types(header: dict) -> None:
    problem = header_problem(header)
    if problem is None:
        assert isinstance(header["op"], str)
        for name, value in header.items():
            if name in FIELD_TYPES:
                assert isinstance(value, FIELD_TYPES[name][0])
    else:
        assert "'" in problem and ("must be" in problem or "no 'op'" in problem)


TENSOR = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=4) | JSON,
        "datatype": st.sampled_from(["FP32", "INT64", "BOOL", "BYTES", "fp32"]) | JSON,
        "shape": st.lists(st.integers(-2, 5), max_size=3) | JSON,
        "data": st.lists(st.floats() | st.integers(), max_size=6) | JSON,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": JSON}) | JSON,
    },
)
REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON,
        "inputs": st.lists(TENSOR, max_size=3) | JSON,
        "outputs": st.lists(st.dictionaries(st.sampled_from(["name", "parameters"]), JSON)) | JSON,
        "parameters": st.dictionaries(
            st.sampled_from(["timeout", "binary_data_output"]), JSON, max_size=2
        )
        | JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(REQUEST, st.binary(max_size=32), st.none() | st.text(max_size=6))
def test_the_kserve_parser_raises_nothing_but_request_errors(
    doc: Any, binary: bytes, header_length: str | None
) -> None:
    head = json.dumps(doc).encode()
    if header_length == "":
        header_length = str(len(head))  # the binary extension, with the length right
    try:
        parse_infer_request(head + binary if header_length else head, header_length)
    except InferRequestError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_the_kserve_parser_survives_any_bytes(body: bytes) -> None:
    try:
        parse_infer_request(body, None)
    except InferRequestError:
        pass


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000, "not valid JSON"),
        (b'{"inputs": ' + b"1" * 5000 + b"}", "not valid JSON"),
        (
            b'{"inputs": [{"name": "x", "datatype": ["FP32"], "shape": [1], "data": [1]}]}',
            "'datatype' must be a string",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": 3}]}',
            "'parameters' must be a JSON object, got a number",
        ),
    ],
)
def test_kserve_odd_bodies_are_request_errors(body: bytes, message: str) -> None:
    with pytest.raises(InferRequestError, match=message):
        parse_infer_request(body, None)


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("FP32", 3.4028235677973366e38), ("FP16", 70000.0), ("BF16", 3.5e38)],
)
def test_a_json_number_past_the_dtypes_range_is_a_request_error(
    datatype: str, value: float
) -> None:
    """Found by the fuzz test above: numpy only warns when a cast overflows, so an inf was
    served (and the warning, as an error under pytest, escaped the parser)."""
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": [value]}]}
    ).encode()
    with pytest.raises(InferRequestError, match="overflow"):
        parse_infer_request(body, None)

"""`json_read.loads` gives what `json.loads` gives, value for value and error for error,
through orjson (the `fast` extra) and without it; `json_read.dumps` writes what reads back
as the stdlib's writing reads, or raises its error."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotreload.protocol import json_read

#: Texts where orjson and the stdlib part ways, or could: each must come out as the stdlib's.
EDGES: list[bytes] = [
    b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 1, -2]}]}',
    b"[NaN, Infinity, -Infinity]",
    b"[1e400, -1e400, 1e-400, 1.7976931348623157e309]",
    b"[9223372036854775807, -9223372036854775808, 18446744073709551615]",
    b"[9223372036854775808, -9223372036854775809, 18446744073709551616]",
    b"123456789012345678901234567890",
    b"-123456789012345678901234567890",
    b"[0.1234567890123456789012, 1234567890123456789.5]",
    b'{"a": 1, "a": 2}',
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b'"\\u00e9 \\u2028 \\ud83d\\ude00"',
    "\ufeff{}".encode(),
    '{"a": "\u00e9"}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32-le"),
    b"[-0, -0.0, 0e0, 1E5, 1e-7]",
    b"[" * 2000 + b"]" * 2000,
    b"[" * 900 + b"]" * 900,
    b"",
    b"   ",
    b"{",
    b'{"a" 1}',
    b"[1, 2,]",
    b"[1] x",
    b'"tab\there"',
    b"\xff\xfe",
    b'{"x": "\xc3\x28"}',
    b"01",
    b"1.",
    b".5",
    b"true false",
    b"nan",
    b"[1e5000000000]",
]


def _same(ours: Any, theirs: Any) -> bool:
    """Equal, NaN included, and of the same types all the way down (1 is not 1.0)."""
    return json.dumps(ours) == json.dumps(theirs) and repr(ours) == repr(theirs)


def _outcome(fn: Any, text: bytes) -> tuple[str, Any]:
    try:
        return "value", fn(text)
    except (ValueError, RecursionError) as exc:
        return "error", (type(exc).__name__, str(exc))


@pytest.fixture(params=["orjson", "stdlib"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs through orjson (when installed) and through the stdlib alone."""
    if request.param == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(json_read, "orjson", None)
    return str(request.param)


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_edges_read_as_the_stdlib_reads_them(reader: str, text: bytes) -> None:
    kind, ours = _outcome(json_read.loads, text)
    their_kind, theirs = _outcome(json.loads, text)
    assert kind == their_kind, (text[:60], ours, theirs)
    assert ours == theirs if kind == "error" else _same(ours, theirs), (text[:60], ours, theirs)


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_any_bytes_like_reads_the_same(reader: str, wrap: Any) -> None:
    text = b'{"op": "infer", "tensors": [{"shape": [1, 64], "nbytes": 256}], "id": 7}'
    assert json_read.loads(wrap(text)) == json.loads(text)
    with pytest.raises(json.JSONDecodeError) as ours:
        json_read.loads(wrap(b'{"a": }'))
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(b'{"a": }')
    assert str(ours.value) == str(theirs.value)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits too
    | st.floats()  # NaN and the infinities too: json.dumps writes them as the stdlib reads
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, ascii_only=st.booleans())
def test_any_json_value_reads_as_the_stdlib_reads_it(value: Any, ascii_only: bool) -> None:
    for orjson in (json_read.orjson, None):
        saved, json_read.orjson = json_read.orjson, orjson
        try:
            text = json.dumps(value, ensure_ascii=ascii_only).encode()
            assert _same(json_read.loads(text), json.loads(text))
        finally:
            json_read.orjson = saved


@settings(max_examples=500, deadline=None)
@given(
    sign=st.sampled_from(["", "-"]),
    whole=st.text("0123456789", min_size=1, max_size=18).filter(
        lambda s: s == "0" or not s.startswith("0")
    ),
    fraction=st.text("0123456789", max_size=18),
    exponent=st.integers(-330, 310),
)
def test_decimal_numbers_round_as_the_stdlib_rounds_them(
    sign: str, whole: str, fraction: str, exponent: int
) -> None:
    """Numbers as clients write them (not only Python's shortest forms): orjson's float
    parsing must land on the same double as the stdlib's, overflow and underflow included."""
    text = f"{sign}{whole}{'.' + fraction if fraction else ''}e{exponent}".encode()
    assert _same(json_read.loads(text), json.loads(text)), text


def test_orjson_reads_what_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the one taken for an ordinary body: the stdlib is not called."""
    pytest.importorskip("orjson")

    def stdlib(text: bytes) -> Any:
        raise AssertionError(f"json.loads read {text[:40]!r}, which orjson reads")

    monkeypatch.setattr(json_read.json, "loads", stdlib)
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [0.1, 2]}]}'
    assert json_read.loads(body)["inputs"][0]["data"] == [0.1, 2]


def test_long_digit_runs_skip_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of 19 digits goes to the stdlib unread by orjson (which would make a float of
    an integer past 64 bits)."""
    orjson = pytest.importorskip("orjson")

    def refuse(text: bytes) -> Any:
        raise AssertionError("orjson was given a text with a 19-digit run")

    monkeypatch.setattr(json_read, "orjson", type("Refusing", (), {"loads": staticmethod(refuse)}))
    assert json_read.loads(b"[-9999999999999999999]") == [-9999999999999999999]
    assert isinstance(orjson.loads(b"123456789012345678901234567890"), float)  # why


# ------------------------------------------------------------------ dumps


def _written(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "value", fn(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return "error", (type(exc).__name__, str(exc))


def _stdlib_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


#: Values where orjson and the stdlib write differently: each must read back as the stdlib's.
DUMP_EDGES: list[Any] = [
    {"op": "infer", "tensors": [{"name": "x", "shape": [1, 64], "nbytes": 256}], "id": 7},
    [0.1, 1e-7, 4.1e-05, 1e16, 1e300, -0.0, 5e-324, 0.12345679104328156],
    [float("nan")],
    [float("inf"), float("-inf")],
    [2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 2**200],
    {"é ☃ \u2028 \x00 \ud800": "\U0001f600"},
    {"a": None},
    {"null": 1, "text": "null"},
    {1: 2, 2.5: "x", None: True},
    (1, [2, (3,)]),
    {"nested": {"a": [], "b": {}}, "k": True},
]


@pytest.mark.parametrize("value", DUMP_EDGES, ids=range(len(DUMP_EDGES)))
def test_dumps_reads_back_as_the_stdlibs_writing(reader: str, value: Any) -> None:
    ours, theirs = _written(json_read.dumps, value), _written(_stdlib_dumps, value)
    assert ours[0] == theirs[0] == "value", (value, ours, theirs)
    assert _same(json.loads(ours[1]), json.loads(theirs[1])), (value, ours, theirs)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_dumps_writes_nan_and_infinities_as_the_stdlib_does(reader: str, value: float) -> None:
    """orjson would write null: a NaN output would come back as None."""
    assert json_read.dumps({"x": [1.5, value]}) == _stdlib_dumps({"x": [1.5, value]})


def _circular() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@dataclass
class _Point:
    x: int = 1


class _Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"x": object()},
        {1.5j: 1},
        {"p": _Point()},
        {"when": datetime.date(2026, 1, 1)},
        {(1, 2): 3},
        _circular(),
    ],
    ids=range(6),
)
def test_dumps_refuses_what_the_stdlib_refuses_with_its_error(reader: str, value: Any) -> None:
    """orjson writes a dataclass or a date, which the stdlib refuses: refused here too."""
    ours, theirs = _written(json_read.dumps, value), _written(_stdlib_dumps, value)
    assert ours == theirs and ours[0] == "error", (ours, theirs)


def test_dumps_writes_a_str_subclass_as_the_stdlib_does(reader: str) -> None:
    assert json_read.dumps({_Text("k"): _Text("v")}) == b'{"k":"v"}'


@settings(max_examples=300, deadline=None)
@given(value=_VALUES)
def test_any_json_value_is_written_to_read_back_as_the_stdlibs(value: Any) -> None:
    for orjson in (json_read.orjson, None):
        saved, json_read.orjson = json_read.orjson, orjson
        try:
            ours = json.loads(json_read.dumps(value))
            assert _same(ours, json.loads(_stdlib_dumps(value))), value
        finally:
            json_read.orjson = saved


def test_orjson_writes_what_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the one taken for an ordinary header and answer: the stdlib's
    encoder is not called."""
    pytest.importorskip("orjson")

    def stdlib(value: Any) -> str:
        raise AssertionError(f"the stdlib wrote {value!r}, which orjson writes")

    monkeypatch.setattr(json_read, "compact_json", stdlib)
    header = {"op": "infer", "tensors": [{"shape": [1, 64], "nbytes": 256}], "deadline": 0.1}
    assert json.loads(json_read.dumps(header)) == header
    # A null is no NaN: the same writer, so a header measures as it is sent, None or not.
    assert json_read.dumps({"text": None, "p": "é"}) == '{"text":null,"p":"é"}'.encode()
    answer = {"model_name": "m", "outputs": [{"data": [0.12345679104328156, -1e-7]}]}
    assert json.loads(json_read.dumps(answer)) == answer

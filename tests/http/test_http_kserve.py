"""KServe v2 tensor parsing and encoding, without a server: every malformed body is named."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotreload.http import kserve
from hotreload.http.kserve import (
    InferRequestError,
    _json_data,
    encode_infer_response,
    kserve_datatype,
    metadata_shape,
    parse_infer_request,
    to_router_request,
)


def binary_body(doc: dict, *blobs: bytes) -> tuple[bytes, str]:
    head = json.dumps(doc).encode()
    return head + b"".join(blobs), str(len(head))


def test_binary_and_json_inputs_become_router_tensors() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    doc = {
        "id": "42",
        "inputs": [
            {
                "name": "b",
                "datatype": "FP32",
                "shape": [2, 3],
                "parameters": {"binary_data_size": 24},
            },
            {"name": "a", "datatype": "INT64", "shape": [2], "data": [7, 8]},
        ],
        "parameters": {"binary_data_output": True, "timeout": 250_000},
    }
    body, length = binary_body(doc, x.tobytes())
    req = parse_infer_request(body, length)
    assert (req.id, req.binary_default, req.timeout_s, req.outputs) == ("42", True, 0.25, None)
    header, payload = to_router_request(
        req, "dict", [{"name": "a", "dtype": "int64"}, {"name": "b", "dtype": "float32"}]
    )
    # Signature order, so a tuple model is called with its arguments in the right places.
    assert [m["name"] for m in header["tensors"]] == ["a", "b"]
    assert header["tensors"][1] == {"name": "b", "dtype": "float32", "shape": [2, 3], "nbytes": 24}
    assert header["timeout_s"] == 0.25 and header["form"] == "dict"
    assert bytes(payload) == np.array([7, 8], np.int64).tobytes() + x.tobytes()


@pytest.mark.parametrize(
    ("doc", "blob", "length", "message"),
    [
        (None, b"{nope", None, "the body is not valid JSON"),
        (None, b"[1, 2]", None, "the request must be a JSON object"),
        ({"inputs": []}, b"", None, "'inputs' must be a non-empty list"),
        (
            {"inputs": [{"name": "x", "datatype": "FP33", "shape": [1], "data": [1]}]},
            b"",
            None,
            "unsupported datatype 'FP33'",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "fp32", "shape": [1], "data": [1]}]},
            b"",
            None,
            "datatypes are upper case",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2], "data": ["a", 5]}]},
            b"",
            None,
            "BYTES 'data' must hold 2 string(s) for shape [2]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]},
            b"",
            None,
            "'data' has 3 element(s) but shape [2, 2] needs 4",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["x"]}]},
            b"",
            None,
            "'data' does not hold float32 values",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2], "data": [1, 2]}]},
            b"",
            None,
            "'shape' must be a list of sizes >= 0",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]},
            b"",
            None,
            "neither 'data' nor parameters.binary_data_size",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "parameters": {"binary_data_size": 12},
                    }
                ]
            },
            b"\0" * 12,
            "auto",
            "binary_data_size is 12 but datatype FP32 and shape [1, 4] need 16 bytes",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "parameters": {"binary_data_size": 16},
                    }
                ]
            },
            b"\0" * 8,
            "auto",
            "runs past the end of the body (8 binary bytes left)",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
            b"\0" * 8,
            "auto",
            "8 binary byte(s) that no input's binary_data_size accounts for",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
            b"",
            "9999",
            "Inference-Header-Content-Length is 9999 but the body has",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
            b"",
            "ten",
            "Inference-Header-Content-Length must be an integer",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(
    doc: dict | None, blob: bytes, length: str | None, message: str
) -> None:
    if doc is None:
        body = blob
    else:
        head = json.dumps(doc).encode()
        body = head + blob
        if length == "auto":
            length = str(len(head))
    with pytest.raises(InferRequestError) as info:
        parse_infer_request(body, length)
    assert message in str(info.value)


def test_response_binary_json_and_requested_outputs() -> None:
    a = np.array([[1.5, -2.0]], np.float32)
    b = np.array([True, False])
    metas = [
        {"name": "a", "dtype": "float32", "shape": [1, 2], "nbytes": 8},
        {"name": "b", "dtype": "bool", "shape": [2], "nbytes": 2},
    ]
    payload = a.tobytes() + b.tobytes()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [0]}]}

    req = parse_infer_request(
        json.dumps({**doc, "parameters": {"binary_data_output": True}}).encode(), None
    )
    pieces, length = encode_infer_response("m", 3, req, metas, payload)
    body = b"".join(pieces)
    head = json.loads(body[:length])
    assert head["model_version"] == "3" and head["model_name"] == "m"
    assert [o["parameters"]["binary_data_size"] for o in head["outputs"]] == [8, 2]
    assert body[length:] == payload

    outputs = [{"name": "b"}, {"name": "a", "parameters": {"binary_data": True}}]
    req = parse_infer_request(json.dumps({**doc, "id": "r1", "outputs": outputs}).encode(), None)
    pieces, length = encode_infer_response("m", 3, req, metas, payload)
    body = b"".join(pieces)
    head = json.loads(body[:length])
    assert head["id"] == "r1"
    assert head["outputs"][0] == {
        "name": "a",
        "datatype": "FP32",
        "shape": [1, 2],
        "parameters": {"binary_data_size": 8},
    }
    assert head["outputs"][1] == {
        "name": "b",
        "datatype": "BOOL",
        "shape": [2],
        "data": [True, False],
    }

    req = parse_infer_request(json.dumps({**doc, "outputs": [{"name": "zz"}]}).encode(), None)
    with pytest.raises(InferRequestError, match=r"requested output\(s\) \['zz'\] do not exist"):
        encode_infer_response("m", 3, req, metas, payload)


def test_metadata_types_and_shapes() -> None:
    assert [kserve_datatype(d) for d in ("float32", "int64", "bool", "float16", "bfloat16")] == [
        "FP32",
        "INT64",
        "BOOL",
        "FP16",
        "BF16",
    ]
    assert metadata_shape([1, 64]) == [-1, 64] and metadata_shape([]) == []


# ------------------------------------------------------------------ JSON data in one C pass

_NUMBERS = st.one_of(
    st.floats(allow_nan=False, width=64),  # infinities, subnormals, past float32's range
    st.just(float("nan")),  # the only NaN JSON text gives (json.loads("NaN"))
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**1100, -(2**1100), 3.4028235e38, 3.4028236e38, 1e-46, -0.0]),
)
_ITEMS = _NUMBERS | st.sampled_from(["1", None, [1.0], {"a": 1}])


def _outcome(data: Any, dtype: str, shape: list[int], bools: bool) -> tuple[str, Any]:
    try:
        return "bytes", _json_data(data, "x", dtype, shape, bools)
    except InferRequestError as exc:
        return "error", str(exc)


@settings(max_examples=400, deadline=None)
@given(
    data=st.lists(_NUMBERS, max_size=8) | st.lists(_ITEMS, max_size=8),
    dtype=st.sampled_from(["float32", "float64"]),
    extra=st.integers(-1, 1),
)
def test_numbers_packed_in_one_pass_are_numpys_bytes(data: list, dtype: str, extra: int) -> None:
    """A text without `true`/`false` takes struct's one pass: the bytes numpy gave, or the
    general path's error for anything else (a string, a null, nesting, an overflow, a
    count that does not fit the shape)."""
    shape = [max(0, len(data) + extra)]
    assert _outcome(data, dtype, shape, bools=False) == _outcome(data, dtype, shape, bools=True)


def test_bools_in_data_are_still_refused() -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, True]}]}
    with pytest.raises(InferRequestError, match="it holds bool"):
        parse_infer_request(json.dumps(doc).encode(), None)


def test_plain_numbers_skip_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of JSON numbers (what clients send) is packed without numpy's conversion."""

    def no_numpy(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("numpy converted a flat list of numbers")

    monkeypatch.setattr(kserve.np, "asarray", no_numpy)
    values = [0.1, 1, -2.5, 3.4e38, 1e-45, 0]
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": values}]}
    req = parse_infer_request(json.dumps(doc).encode(), None)
    assert bytes(req.inputs[0].data) == np.array(values, np.float32).tobytes()

"""KServe v2 tensor parsing and encoding, without a server: every malformed body is named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotreload.http.kserve import (
    InferRequestError,
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

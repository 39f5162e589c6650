"""Inputs that slipped through each get a clean error (issue 30, item 12)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from hotreload.config import load_config
from hotreload.engine.router import ModelRouter
from hotreload.errors import BadRequestError, ConfigError
from tests.support import make_project


def submit(header: dict[str, Any], payload: bytes) -> BaseException | None:
    async def run() -> BaseException | None:
        r = ModelRouter(name="m", max_queue_size=4, request_timeout_s=5, max_inflight=1)
        out: list[BaseException | None] = []
        r.submit(header, payload, lambda f, e: out.append(e))
        r.fail_queued(BadRequestError("queued, not refused"))
        return out[0]

    return asyncio.run(asyncio.wait_for(run(), 30))


X = {"name": "x", "dtype": "float32", "shape": [64], "nbytes": 256}


def test_a_float_nbytes_is_refused_at_the_edge() -> None:
    err = submit({"tensors": [{**X, "nbytes": 256.0}]}, bytes(256))
    assert isinstance(err, BadRequestError) and "nbytes 256.0" in str(err)


def test_an_unknown_form_is_refused() -> None:
    err = submit({"tensors": [X], "form": "bogus"}, bytes(256))
    assert isinstance(err, BadRequestError) and "form 'bogus'" in str(err)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_timeout_must_be_a_finite_number(tmp_path: Path, value: str) -> None:
    config = make_project(tmp_path)
    text = config.read_text().replace("request_timeout_s = 10.0", f"request_timeout_s = {value}")
    config.write_text(text)
    with pytest.raises(ConfigError, match=r"request_timeout_s.*finite number"):
        load_config(config)


@pytest.mark.parametrize(
    "data, message",
    [
        (["1"] * 4, "holds strings"),
        ([None] * 4, "holds nulls"),
        ([[1.0, 2.0], [3.0]], "nested unevenly"),
        ([[1.0], [2.0], [3.0], [4.0]], "nests as [4, 1], not as shape [2, 2]"),
    ],
)
def test_http_data_must_be_numbers_flat_or_nested_as_the_shape(data: Any, message: str) -> None:
    import json

    from hotreload.http.kserve import InferRequestError, parse_infer_request

    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": data}]}
    with pytest.raises(InferRequestError, match=re.escape(message)):
        parse_infer_request(json.dumps(doc).encode(), None)
    ok = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}
    assert parse_infer_request(json.dumps(ok).encode(), None).inputs[0].shape == [2, 2]

"""A request's inputs against the model's, on both fronts (HTTP and the socket client):
an input the model does not take, a missing one, and strings with an extra dimension each
get a clear 400 naming what the model takes (issue 30, item 12), never a worker error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hotreload.client import Client
from hotreload.errors import BadRequestError
from tests.http.support_http import error_of, request

MODELS = """
import torch


def build_echo():
    return lambda texts: [t.upper() for t in texts]


def example_echo():
    return ["a", "b"]


class Pair(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def build_pair():
    return Pair()


def example_pair():
    return {"a": torch.zeros(1, 4), "b": torch.zeros(1, 4)}
"""

CONFIG = "".join(
    f'[[models]]\nname = "{name}"\nentry = "models.py:build_{name}"\n'
    f'example = "models.py:example_{name}"\nthreads = 1\nwarmup_iters = 1\n\n'
    for name in ("echo", "pair")
)


@pytest.fixture
def served(tmp_path: Path, http_serve):  # type: ignore[no-untyped-def]
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "models.py").write_text(MODELS)
    (proj / "hotreload.toml").write_text(CONFIG)
    return proj / "hotreload.toml", http_serve(proj / "hotreload.toml")


def post(url: str, model: str, inputs: list[dict]) -> tuple[int, bytes]:
    body = json.dumps({"inputs": inputs}).encode()
    status, _, reply = request(url, f"/v2/models/{model}/infer", body)
    return status, reply


def strings(shape: list[int], data: list[str]) -> dict:
    return {"name": "input", "datatype": "BYTES", "shape": shape, "data": data}


def floats(name: str) -> dict:
    return {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}


def test_strings_with_a_trailing_dimension_are_refused_saying_the_shape(served) -> None:  # type: ignore[no-untyped-def]
    config, server = served
    status, reply = post(server.url, "echo", [strings([2], ["a", "b"])])
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == ["A", "B"], reply
    status, reply = post(server.url, "echo", [strings([1, 1], ["a"])])
    assert status == 400, reply
    message = error_of(reply)
    assert "expected shape [N] (dimension 0 may vary), got [1, 1]" in message
    assert "send the strings with shape [N], without the trailing 1" in message
    with Client(config=config) as client:
        assert client.infer("echo", ["a"]).output == ["A"]
        with pytest.raises(BadRequestError, match=r"got \[1, 1\].*without the trailing 1"):
            client.infer("echo", np.array([["a"]], dtype=object))


def test_an_input_the_model_does_not_take_is_refused_naming_its_inputs(served) -> None:  # type: ignore[no-untyped-def]
    config, server = served
    takes = "the model takes a (float32 [N, 4]), b (float32 [N, 4])"
    status, reply = post(server.url, "pair", [floats("a"), floats("shapes")])
    assert status == 400, reply
    message = error_of(reply)
    assert "the model has no input named 'shapes'; input 'b' is missing" in message
    assert takes in message
    status, reply = post(server.url, "pair", [floats("a"), floats("b")])
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [2.0] * 4, reply
    x = np.ones((1, 4), np.float32)
    with Client(config=config) as client:
        with pytest.raises(BadRequestError, match="no input named 'shapes'.*" + re.escape(takes)):
            client.infer("pair", {"a": x, "b": x, "shapes": x})
        np.testing.assert_array_equal(client.infer("pair", {"a": x, "b": x}).output, x * 2)

"""One input, one answer, and requests of any size: a real session, compared bit for bit with
the same model called in this process.

Kernels round differently for data at other memory alignments (AVX-512 oneDNN paths), so
each served answer must equal the in-process call exactly, whatever the header's length."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from hotreload import AsyncClient, Client
from tests.http.conftest import HttpServeProcess
from tests.support import make_project, shared_server

BIG_MODELS = '''
import torch

class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1

class Widen(torch.nn.Module):
    """A small request, a reply 1024 times its size."""

    def forward(self, x):
        return x.repeat(1, 1024) * 3

def build_double():
    return Double()

def build_widen():
    return Widen()

def example():
    return torch.ones(1, 64)
'''

BIG_CONFIG = """
[[models]]
name = "mlp"
entry = "model.py:build"
example = "model.py:example_input"
weights = ["weights.safetensors"]
threads = 1

[[models]]
name = "double"
entry = "big.py:build_double"
example = "big.py:example"
threads = 1
request_timeout_s = 60

[[models]]
name = "widen"
entry = "big.py:build_widen"
example = "big.py:example"
threads = 1
request_timeout_s = 60
"""

KIB, MIB = 1024, 1024 * 1024


def in_process_mlp(project: Path) -> Any:
    """The example model built and loaded as the worker does, on one thread."""
    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("hr_exact_model", project.parent / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    model.load_state_dict(load_file(project.parent / "weights.safetensors"))
    model.eval()

    def call(x: np.ndarray) -> np.ndarray:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                # torch.tensor copies into torch's own (64-byte aligned) memory.
                return model(torch.tensor(x)).numpy()
        finally:
            torch.set_num_threads(threads)

    return call


@pytest.fixture(scope="module")
def big_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One session for the module: every test only asks it (no reload, no edit), and a
    session with its three workers costs far more than the requests."""
    config = make_project(
        tmp_path_factory.mktemp("exact"), config=BIG_CONFIG, files={"big.py": BIG_MODELS}
    )
    with shared_server(config, process_cls=HttpServeProcess) as server:
        yield server


def test_one_input_gives_one_answer_whatever_the_header_length(big_session: Any) -> None:
    config = big_session.config
    x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
    expected = in_process_mlp(config)(x)
    answers: set[bytes] = set()
    with Client(config=config) as client:
        from hotreload.client import build_infer_header, decode_result

        for pad in range(64):
            header, blobs = build_infer_header("mlp", x, None)
            header["pad"] = "p" * pad  # moves where the payload lands in the frame
            out = decode_result(client.call(header, blobs)).output
            answers.add(out.tobytes())
    # The HTTP path, JSON and binary, with request ids of 32 lengths.
    triton = httpclient.InferenceServerClient(url=big_session.address, network_timeout=60)
    try:
        for pad in range(32):
            for binary in (True, False):
                inp = httpclient.InferInput("input", [3, 64], "FP32")
                inp.set_data_from_numpy(x, binary_data=binary)
                out = httpclient.InferRequestedOutput("output", binary_data=binary)
                result = triton.infer("mlp", [inp], outputs=[out], request_id="r" * (pad + 1))
                answers.add(result.as_numpy("output").tobytes())
    finally:
        triton.close()
    assert len(answers) == 1, f"{len(answers)} distinct answers to one input"
    np.testing.assert_array_equal(np.frombuffer(answers.pop(), np.float32).reshape(3, 10), expected)


def through_every_client(session: Any, model: str, x: np.ndarray) -> list[np.ndarray]:
    """The answers to `x` from `Client`, `AsyncClient` and tritonclient's binary HTTP."""
    with Client(config=session.config, timeout_s=60) as client:
        answers = [client.infer(model, x).output]

    async def through_async() -> np.ndarray:
        async with AsyncClient(config=session.config) as aclient:
            return (await aclient.infer(model, x, timeout_s=60)).output

    answers.append(asyncio.run(asyncio.wait_for(through_async(), 120)))
    triton = httpclient.InferenceServerClient(
        url=session.address, network_timeout=120, connection_timeout=120
    )
    try:
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        answers.append(triton.infer(model, [inp]).as_numpy("output"))
    finally:
        triton.close()
    return answers


@pytest.mark.parametrize("nbytes", [256 * KIB, 4 * MIB, 32 * MIB])
def test_requests_of_any_size_through_every_client(big_session: Any, nbytes: int) -> None:
    x = np.random.default_rng(nbytes).standard_normal((nbytes // 256, 64), dtype=np.float32)
    expected = (torch.tensor(x) * 2 + 1).numpy()
    for answer in through_every_client(big_session, "double", x):
        np.testing.assert_array_equal(answer, expected)


def test_a_32_mib_reply_through_every_client(big_session: Any) -> None:
    x = np.random.default_rng(5).standard_normal((128, 64), dtype=np.float32)
    expected = (torch.tensor(x).repeat(1, 1024) * 3).numpy()
    assert expected.nbytes == 32 * MIB
    for answer in through_every_client(big_session, "widen", x):
        np.testing.assert_array_equal(answer, expected)

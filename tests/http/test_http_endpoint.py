"""The KServe v2 endpoint end to end: a real session process, `tritonclient.http` as the
client, raw requests where a malformed body is the point."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hotreload import Client
from hotreload.client import http_headers
from tests.http.support_http import (
    chunked_post,
    error_of,
    json_infer,
    request,
    scrape,
    value,
)
from tests.support import make_project

SLOW_MODEL = '''
import time
import torch

class Slow(torch.nn.Module):
    """x[0, 0] seconds of sleep; -1000 raises; 7.0 (the example) sleeps 0.1 s: slow warm-up."""

    def forward(self, x):
        first = float(x[0, 0])
        if first == -1000:
            raise ValueError("refusing -1000 on purpose")
        time.sleep(0.1 if first == 7.0 else min(max(first, 0.0), 30.0))
        return x * 2

def build():
    return Slow()

def example():
    return torch.full((1, 4), 7.0)
'''


def slow_project(tmp_path: Path, warmup_iters: int = 1) -> Path:
    config = f"""
[[models]]
name = "slow"
entry = "slow.py:build"
example = "slow.py:example"
max_queue_size = 2
max_inflight = 1
request_timeout_s = 10
warmup_iters = {warmup_iters}
threads = 1
"""
    return make_project(tmp_path, config=config, files={"slow.py": SLOW_MODEL})


def triton(server) -> httpclient.InferenceServerClient:  # type: ignore[no-untyped-def]
    return httpclient.InferenceServerClient(url=server.address, network_timeout=30)


def test_infer_binary_and_json_and_metadata(project: Path, http_serve) -> None:
    server = http_serve(project, "--metrics-port", "0")
    client = triton(server)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
        meta = client.get_server_metadata()
        assert meta["name"] == "hotreload" and "binary_tensor_data" in meta["extensions"]
        digest = Client(config=project).status()["models"][0]["digest"]
        assert digest.startswith("sha256:")
        assert client.get_model_metadata("mlp") == {
            "parameters": {"weights_digest": digest},
            "name": "mlp",
            "versions": ["1"],
            "platform": "pytorch",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}],
        }

        x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
        expected, _, _ = Client(config=project).infer("mlp", x)  # the socket path

        # tritonclient's default: binary input, binary outputs (binary_data_output).
        inp = httpclient.InferInput("INPUT__0", [3, 64], "FP32")  # any name for one input
        inp.set_data_from_numpy(x)
        result = client.infer("mlp", [inp])
        assert result.get_response()["model_version"] == "1"
        assert result.get_response()["parameters"] == {"weights_digest": digest}
        assert result.get_response()["outputs"][0]["parameters"] == {"binary_data_size": 120}
        np.testing.assert_array_equal(result.as_numpy("output"), expected)

        # JSON both ways, addressed to the version explicitly.
        inp = httpclient.InferInput("input", [3, 64], "FP32")
        inp.set_data_from_numpy(x, binary_data=False)
        out = httpclient.InferRequestedOutput("output", binary_data=False)
        result = client.infer("mlp", [inp], model_version="1", outputs=[out], request_id="r7")
        response = result.get_response()
        assert response["id"] == "r7" and response["model_version"] == "1"
        assert "data" in response["outputs"][0]
        np.testing.assert_array_equal(result.as_numpy("output"), expected)

        # Compressed both ways, as tritonclient offers.
        result = client.infer(
            "mlp",
            [inp],
            request_compression_algorithm="gzip",
            response_compression_algorithm="deflate",
        )
        np.testing.assert_array_equal(result.as_numpy("output"), expected)

        with pytest.raises(InferenceServerException, match="version 7 is not available") as info:
            client.infer("mlp", [inp], model_version="7")
        assert info.value.status() == "404"
    finally:
        client.close()

    # curl-style: plain JSON, no client library.
    status, _, body = request(server.url, "/v2/models/mlp/infer", json_infer([0.5] * 64, [1, 64]))
    assert status == 200 and json.loads(body)["outputs"][0]["shape"] == [1, 10]
    assert request(server.url, "/v2/health/live")[0] == 200
    assert request(server.url, "/v2/health/ready")[0] == 200

    # /metrics on the main port, and alone on the metrics port (Triton's 8002 layout).
    main, alone = scrape(server.url), scrape(server.metrics_url.removesuffix("/metrics"))
    assert value(main, "nv_inference_request_success", model="mlp") >= 4
    assert value(alone, "nv_inference_request_success", model="mlp") >= 4
    status, _, body = request(server.metrics_url.removesuffix("/metrics"), "/v2/health/ready")
    assert status == 404 and "no such endpoint" in error_of(body)


def test_bad_requests_are_clear_4xx_and_the_server_carries_on(tmp_path: Path, http_serve) -> None:
    config = make_project(tmp_path)
    config.write_text("max_frame_mib = 1\n" + config.read_text())
    server = http_serve(config)
    url = server.url
    infer = "/v2/models/mlp/infer"
    client = triton(server)

    def refused(body: bytes, status: int = 400, headers: dict | None = None) -> str:
        got, _, answer = request(url, infer, body, headers)
        assert got == status, answer
        return error_of(answer)

    try:
        assert "the body is not valid JSON" in refused(b'{"inputs": [')
        assert "expected dtype float32, got int64" in refused(
            json_infer([0] * 64, [1, 64], datatype="INT64")
        )
        assert "unsupported datatype 'FP33'" in refused(
            json_infer([0] * 64, [1, 64], datatype="FP33")
        )
        assert "expected dtype float32, got bytes" in refused(
            json_infer(["a"], [1], datatype="BYTES")
        )
        assert "expected shape [N, 64] (dimension 0 may vary), got [1, 32]" in refused(
            json_infer([0] * 32, [1, 32])
        )
        assert "'data' has 64 element(s) but shape [2, 64] needs 128" in refused(
            json_infer([0] * 64, [2, 64])
        )
        # Wrong binary_data_size, the way tritonclient lays the body out.
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 64],
                        "parameters": {"binary_data_size": 200},
                    }
                ]
            }
        ).encode()
        message = refused(
            head + b"\0" * 200, headers={"Inference-Header-Content-Length": str(len(head))}
        )
        assert "binary_data_size is 200 but datatype FP32 and shape [1, 64] need 256" in message

        # Over max_frame_mib (1 MiB here): refused from Content-Length, and without one.
        big = np.zeros((5000, 64), np.float32)
        inp = httpclient.InferInput("x", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException, match="over the 1048576 byte limit") as info:
            client.infer("mlp", [inp])
        assert info.value.status() == "413"
        status, answer = chunked_post(url, infer, [b"\0" * 65536] * 24)
        assert status == 413 and "Maximum request body size" in error_of(answer)

        status, _, answer = request(url, "/v2/models/nope/infer", json_infer([0] * 64, [1, 64]))
        assert status == 404 and "unknown model 'nope'; this session serves: mlp" in error_of(
            answer
        )
        status, _, answer = request(url, "/v2/teapot")
        assert status == 404 and "no such endpoint" in error_of(answer)

        # The server is unaffected: a good request still gets the right answer.
        x = np.ones((2, 64), np.float32)
        inp = httpclient.InferInput("x", [2, 64], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(
            client.infer("mlp", [inp]).as_numpy("output"), Client(config=config).infer("mlp", x)[0]
        )
    finally:
        client.close()
    samples = scrape(url)
    bad = value(samples, "hotreload_requests_total", outcome="rejected", reason="bad_request")
    assert bad >= 8
    assert value(samples, "nv_inference_request_failure", reason="OTHER") == bad


def test_queue_full_timeout_and_model_error_status(tmp_path: Path, http_serve) -> None:
    server = http_serve(slow_project(tmp_path))
    url, infer = server.url, "/v2/models/slow/infer"

    def send(first: float) -> tuple[int, bytes]:
        status, _, body = request(url, infer, json_infer([first, 0, 0, 0], [1, 4]))
        return status, body

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(send, [1.0] * 6))
    served = [b for s, b in results if s == 200]
    full = [error_of(b) for s, b in results if s == 503]
    # One in flight and two queued fit; the rest are turned away at once.
    assert len(served) >= 2 and len(full) >= 2, results
    assert "Exceeds maximum queue size (depth 2, limit 2)" in full[0]

    status, body = send(-1000)
    assert status == 500 and "refusing -1000 on purpose" in error_of(body)
    # The traceback shows the owner's code: only to a request with the session's token.
    assert "traceback" not in json.loads(body)
    config = tmp_path / "proj" / "hotreload.toml"
    status, _, body = request(
        url, infer, json_infer([-1000, 0, 0, 0], [1, 4]), http_headers(config)
    )
    assert status == 500 and "slow.py" in json.loads(body)["traceback"]

    # Triton's `timeout` parameter is in microseconds: 0.3 s here, for a 2 s forward (which
    # would answer 200 if the timeout were ignored).
    doc = json.loads(json_infer([2.0, 0, 0, 0], [1, 4]))
    doc["parameters"] = {"timeout": 300_000}
    status, _, body = request(url, infer, json.dumps(doc).encode())
    assert status == 504 and "timed out after 0.3 s" in error_of(body)

    samples = scrape(url)
    assert value(samples, "hotreload_requests_total", outcome="rejected", reason="queue_full") >= 2
    assert value(samples, "hotreload_requests_total", outcome="timed_out") == 1
    assert value(samples, "nv_inference_request_success", model="slow", version="1") >= 2


def test_not_ready_during_warm_up_then_ready(tmp_path: Path, http_serve) -> None:
    # 25 warm-up passes of 0.1 s each: at least 2.5 s in which the model is not ready.
    server = http_serve(slow_project(tmp_path, warmup_iters=25), wait_ready=False)
    url = server.url  # printed before the models start
    seen: list[tuple[int, str]] = []
    checked_while_bringing_up = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, _, body = request(url, "/v2/health/ready")
        seen.append((status, body.decode()))
        if status == 200:
            break
        # Checked once, at the first sight of loading/warming: 2.5 s of warm-up remain, so
        # the model cannot turn ready between these requests.
        if not checked_while_bringing_up and re.search("is (loading|warming)", seen[-1][1]):
            checked_while_bringing_up = True
            assert request(url, "/v2/health/live")[0] == 200
            assert request(url, "/v2/models/slow/ready")[0] == 400
            samples = scrape(url)
            assert value(samples, "hotreload_model_ready", model="slow") == 0
            assert value(samples, "hotreload_model_version", model="slow") == 0
        time.sleep(0.05)
    assert seen[-1][0] == 200, seen[-5:]
    assert checked_while_bringing_up, seen[-5:]
    bringing_up = [b for s, b in seen if s == 400 and re.search("is (loading|warming)", b)]
    assert "no version has finished warm-up yet" in bringing_up[0]
    # Ready only once the whole warm-up (25 passes of 0.1 s of sleep) has finished.
    samples = scrape(url)
    assert value(samples, "hotreload_model_warmup_seconds", model="slow") >= 2.5
    assert value(samples, "hotreload_model_ready", model="slow") == 1
    assert request(url, "/v2/models/slow/ready")[0] == 200
    status, _, body = request(url, "/v2/models/slow/infer", json_infer([0, 1, 2, 3], [1, 4]))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0, 2, 4, 6]

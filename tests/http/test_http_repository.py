"""The repository extension: `tritonclient.http` load_model reloads through the serialized
reload path; a broken edit answers the error while the old version keeps serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hotreload.client import http_headers
from tests.http.support_http import error_of, request, scrape, value

X = np.random.default_rng(5).standard_normal((2, 64), dtype=np.float32)


def infer(client: httpclient.InferenceServerClient) -> tuple[np.ndarray, str]:
    inp = httpclient.InferInput("input", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    result = client.infer("mlp", [inp])
    return result.as_numpy("output"), result.get_response()["model_version"]


def edit(project: Path, old: str, new: str) -> None:
    model = project.parent / "model.py"
    text = model.read_text()
    assert old in text
    model.write_text(text.replace(old, new))


def test_load_model_reloads_and_a_broken_edit_keeps_the_old_version(
    project: Path, http_serve
) -> None:
    server = http_serve(project)
    auth = http_headers(project)  # the session's token: load and unload need it
    client = httpclient.InferenceServerClient(url=server.address, network_timeout=60)
    try:
        before, version = infer(client)
        assert version == "1"

        edit(project, "SCALE = 1.0", "SCALE = 2.0")
        client.load_model("mlp", headers=auth)  # answers once the reload has succeeded
        after, version = infer(client)
        assert version == "2"
        np.testing.assert_array_equal(after, before * 2)
        assert client.get_model_metadata("mlp")["versions"] == ["2"]

        edit(project, "SCALE = 2.0", "SCALE = 2.0\nraise RuntimeError('broken on purpose')")
        with pytest.raises(InferenceServerException) as info:
            client.load_model("mlp", headers=auth)
        message = info.value.message()
        assert "failed to load 'mlp' in load" in message and "broken on purpose" in message
        assert "version 2 keeps serving" in message and info.value.status() == "500"
        still, version = infer(client)
        assert version == "2"
        np.testing.assert_array_equal(still, after)
        assert client.is_server_ready() and client.is_model_ready("mlp")
    finally:
        client.close()

    samples = scrape(server.url)
    assert value(samples, "hotreload_reloads_total", outcome="success", trigger="http") == 1
    assert value(samples, "hotreload_reloads_total", outcome="failed", trigger="http") == 1
    assert value(samples, "hotreload_reload_failures_total", phase="load") == 1
    phases = {
        s.labels["phase"]
        for s in samples["hotreload_reload_phase_duration_seconds_count"]
        if s.value > 0
    }
    assert {"load", "warm", "smoke", "swap"} <= phases, phases
    assert value(samples, "hotreload_reload_phase_duration_seconds_sum", phase="load") > 0
    assert value(samples, "hotreload_reload_duration_seconds_count", model="mlp") == 1
    assert value(samples, "hotreload_model_version", model="mlp") == 2
    assert value(samples, "hotreload_model_state", model="mlp", state="serving") == 1
    assert value(samples, "nv_model_load_duration_secs", model="mlp", version="2") > 0
    assert value(samples, "nv_inference_request_success", model="mlp", version="2") == 3
    assert value(samples, "hotreload_request_duration_seconds_count", model="mlp") == 3
    assert value(samples, "nv_inference_pending_request_count", model="mlp") == 0


def test_unload_load_and_repository_index(project: Path, http_serve) -> None:
    server = http_serve(project)
    url = server.url
    auth = http_headers(project)
    client = httpclient.InferenceServerClient(url=server.address, network_timeout=60)
    try:
        assert client.get_model_repository_index(headers=auth) == [
            {"name": "mlp", "version": "1", "state": "READY"}
        ]
        client.unload_model("mlp", headers=auth)
        assert not client.is_server_ready() and not client.is_model_ready("mlp")
        (entry,) = client.get_model_repository_index(headers=auth)
        assert entry["state"] == "UNAVAILABLE" and "unloaded" in entry["reason"]
        status, _, body = request(url, "/v2/models/mlp/infer", b"{}")
        assert status == 503 and "is unloaded" in error_of(body)

        client.load_model("mlp", headers=auth)  # loads it again
        assert client.is_server_ready() and client.is_model_ready("mlp")
        out, version = infer(client)
        # Versions only rise within a session: the load after an unload serves v2, not v1.
        assert out.shape == (2, 10) and version == "2"
        assert client.get_model_repository_index(headers=auth)[0]["version"] == "2"

        with pytest.raises(InferenceServerException, match="override is not supported"):
            client.load_model("mlp", headers=auth, config='{"max_batch_size": 8}')
        with pytest.raises(InferenceServerException, match="unknown model 'nope'") as info:
            client.load_model("nope", headers=auth)
        assert info.value.status() == "404"
    finally:
        client.close()

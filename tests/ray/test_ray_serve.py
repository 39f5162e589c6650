"""`hotreload export ray` on a real local Ray cluster: the example MLP with 2 replicas and
the tiny LM with 1, asked by tritonclient and curl-style JSON; weights updates as Ray
lightweight updates (same replica pids), a bad one refused on every replica, a code update
rolled under 16 closed-loop clients, and a clean shutdown. One cluster for the module
(conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from safetensors.torch import load_file, save_file

from hotreload.commands.export import export_ray_main
from tests.ray.conftest import Deployed
from tests.ray.support_ray import Load, infer_mlp

# The first test also waits for the module's cluster and deploy (conftest.py): minutes on a
# loaded 2-core machine, so a longer bound than the suite's 120 s.
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _mlp_reference(d: Deployed, weights: Path, x: np.ndarray) -> np.ndarray:
    """The served model called in-process: the oracle for every answer."""
    mod = _module(d.project / "mlp" / "model.py", "ray_test_mlp_model")
    model = mod.build()
    model.load_state_dict(load_file(str(weights)))
    with torch.inference_mode():
        return model.eval()(torch.from_numpy(x)).numpy()


def _close(a: np.ndarray, b: np.ndarray) -> None:
    # Same machine, other thread counts: kernels may round differently in the last bits.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _digests(d: Deployed, n: int = 24) -> set[str]:
    return {str(infer_mlp(d.port, np.ones((1, 64), np.float32))[1]["weights_digest"])
            for _ in range(n)}  # fmt: skip


def _redeploy_and_wait(
    d: Deployed, until: Any, timeout_s: float = 120.0, *, cli: bool = False
) -> None:
    """serve_config.yaml deployed again, by `serve deploy` (`cli`) or by the request it sends
    (under load: the CLI's start would stretch the test by 20 s of contended CPU, not the
    update), then polled until `until()` holds."""
    if cli:
        d.cluster.deploy(d.out / "serve_config.yaml")
    else:
        d.cluster.put_config(d.out / "serve_config.yaml")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        apps = d.cluster.applications()
        if apps["mlp"]["status"] == "RUNNING" and until():
            return
    raise TimeoutError("the update did not reach every replica")


def test_equal_outputs_through_tritonclient(deployed: Deployed) -> None:
    d = deployed
    client = httpclient.InferenceServerClient(f"127.0.0.1:{d.port}")
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)  # binary, as tritonclient sends by default
    result = client.infer("mlp", [inp])
    response = result.get_response()
    _close(result.as_numpy("output"), _mlp_reference(d, d.project / "mlp/weights.safetensors", x))
    assert response["model_version"] == "1"
    assert response["parameters"]["weights_digest"].startswith("sha256:")
    # curl's JSON form gives the same answer
    out, params = infer_mlp(d.port, x)
    _close(out, result.as_numpy("output"))
    assert params["weights_digest"] == response["parameters"]["weights_digest"]

    lm = _module(d.project / "tiny_lm" / "model.py", "ray_test_tiny_lm").build()
    prompts = np.array([b"Once upon a time", b"hotreload"], dtype=object)
    text = httpclient.InferInput("input", [2], "BYTES")
    text.set_data_from_numpy(prompts)
    answer = client.infer("gen", [text])
    name = answer.get_response()["outputs"][0]["name"]
    served = [v.decode() for v in answer.as_numpy(name).reshape(-1)]
    with torch.inference_mode():
        assert served == list(lm(["Once upon a time", "hotreload"]))

    bad = httpclient.InferInput("input", [1, 3], "FP32")
    bad.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(Exception, match=r"mat1 and mat2|shape"):
        client.infer("mlp", [bad])


def test_weights_update_keeps_replica_pids(deployed: Deployed, tmp_path: Path) -> None:
    d = deployed
    before = d.cluster.pids("mlp")
    assert len(before) == 2
    state = load_file(str(d.project / "mlp/weights.safetensors"))
    new = tmp_path / "scaled.safetensors"
    save_file({k: v * 1.5 for k, v in state.items()}, str(new))
    assert export_ray_main(str(d.out), None, "mlp", [str(new)]) == 0
    old = _digests(d)
    with Load(d.port, clients=16) as load:
        _redeploy_and_wait(d, lambda: len(_digests(d, 12) - old) == 1 and not _digests(d, 12) & old)
        time.sleep(1.0)
    assert load.failures == [], load.failures[:5]
    assert load.ok > 0
    assert d.cluster.pids("mlp") == before  # the same processes: a lightweight update
    x = np.ones((2, 64), np.float32)
    out, params = infer_mlp(d.port, x)
    _close(out, _mlp_reference(d, new, x))
    assert params["model_version"] == "2"
    assert "weights_update" not in params


def test_bad_update_keeps_the_old_weights_on_every_replica(
    deployed: Deployed, tmp_path: Path
) -> None:
    d = deployed
    before_pids = d.cluster.pids("mlp")
    serving = _digests(d)
    assert len(serving) == 1
    state = load_file(str(d.project / "mlp/weights.safetensors"))
    state["out.bias"] = state["out.bias"] * float("nan")
    bad = tmp_path / "nan.safetensors"
    save_file(state, str(bad))
    assert export_ray_main(str(d.out), None, "mlp", [str(bad)]) == 0

    def refused_everywhere() -> bool:
        params = [infer_mlp(d.port, np.ones((1, 64), np.float32))[1] for _ in range(16)]
        return all(str(p.get("weights_update", "")).startswith("failed") for p in params)

    _redeploy_and_wait(d, refused_everywhere, cli=True)  # `serve deploy` reads an update too
    assert _digests(d) == serving
    assert d.cluster.pids("mlp") == before_pids
    _, params = infer_mlp(d.port, np.ones((1, 64), np.float32))
    assert "non-finite" in params["weights_update"]
    logs = d.cluster.temp_dir / "session_latest" / "logs" / "serve"
    errors = [
        line
        for log in logs.glob("replica_mlp_*.log")
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("ERROR") and "weights update failed" in line
    ]
    assert len(errors) >= 2, "each replica logs the refusal at ERROR"


def test_code_update_rolls_the_replicas_under_load(deployed: Deployed) -> None:
    d = deployed
    before = d.cluster.pids("mlp")
    model_py = d.project / "mlp" / "model.py"
    model_py.write_text(model_py.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
    x = np.ones((1, 64), np.float32)
    want = _mlp_reference(d, d.project / "mlp/weights.safetensors", x)
    gen_pids = d.cluster.pids("gen")
    # One model re-exported: only its zip (runtime_env) changes, only its replicas roll.
    assert export_ray_main(str(d.out), str(d.project / "hotreload.toml"), "mlp") == 0

    def new_code_everywhere() -> bool:
        pids = d.cluster.pids("mlp")
        return len(pids) == 2 and not pids & before

    with Load(d.port, clients=16) as load:
        _redeploy_and_wait(d, new_code_everywhere, timeout_s=180.0)
        time.sleep(1.0)
    assert load.failures == [], load.failures[:5]
    assert load.ok > 0
    for _ in range(8):
        _close(infer_mlp(d.port, x)[0], want)
    assert d.cluster.pids("gen") == gen_pids


def test_clean_shutdown(deployed: Deployed) -> None:
    d = deployed
    replicas = d.cluster.pids("mlp") | d.cluster.pids("gen")
    done = d.cluster.serve("shutdown", "-y")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in replicas):
        time.sleep(0.5)
    assert not [p for p in replicas if _alive(p)]
    d.cluster.stop()
    assert d.cluster.alive() == []
    with pytest.raises(OSError):
        infer_mlp(d.port, np.ones((1, 64), np.float32), timeout_s=5)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

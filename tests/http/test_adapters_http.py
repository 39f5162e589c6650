"""peft adapters served side by side over one base, end to end: a real `hotreload watch`
session with its HTTP endpoint, a GPT-2 base as `save_pretrained` writes it and two LoRA
adapters as peft's `save_pretrained` writes them, every answer compared with peft's own
PeftModel called in this process. An adapter is chosen per request on the socket client,
KServe v2 and `/v1/completions` ("lm:b"); an adapter save reloads that adapter only (the
base's tensors shared, no re-import); a push of adapter tensors alone serves them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hotreload import Client
from hotreload.client import http_headers
from hotreload.errors import BadRequestError
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import request
from tests.support import count_events, read_events

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from tests.evalharness.make_lm import make_lm  # noqa: E402

#: peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` in PeftModel().
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)
IDS = np.array([[5, 9, 2, 7, 1, 3]], dtype=np.int64)
TOL = {"rtol": 1e-4, "atol": 1e-4}

MODEL = """
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

BASE = Path(__file__).resolve().parent / "lm"


def build():
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(BASE))


def example():
    return {"input_ids": torch.arange(8).reshape(1, 8)}
"""

CONFIG = """
[[models]]
name = "lm"
entry = "model.py:build"
example = "model.py:example"
weights = ["lm/model.safetensors"]
adapters = { a = "adapters/a", b = "adapters/b" }
device = "cpu"
warmup_iters = 1
threads = 1
request_timeout_s = 60.0
shapes = { input_ids = [-1, -1] }
generator = true
tokenizer = "lm"

[watch]
quiet_ms = 50
"""


def base_model(root: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(root / "lm").eval()


def save_adapter(root: Path, name: str, seed: int) -> Path:
    """A LoRA adapter of the base's attention, as peft saves it (B not zero, so it shows)."""
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(
        r=4, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False
    )
    folder = root / "adapters" / name
    tmp = root / "adapters" / f".{name}.tmp"
    peft.get_peft_model(base_model(root), cfg).save_pretrained(tmp)
    folder.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        f.replace(folder / f.name)  # a rename over the old file: a reader sees one or the other
    tmp.rmdir()
    return folder


def peft_logits(root: Path, name: str | None, ids: np.ndarray = IDS) -> np.ndarray:
    """peft's own answer: PeftModel over the base with adapter `name` (None: the base)."""
    model = base_model(root)
    if name is not None:
        model = peft.PeftModel.from_pretrained(model, root / "adapters" / name).eval()
    with torch.inference_mode():
        return model(input_ids=torch.from_numpy(ids)).logits.numpy()


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    make_lm(root / "lm")
    (root / "model.py").write_text(MODEL)
    save_adapter(root, "a", 1)
    save_adapter(root, "b", 2)
    (root / "hotreload.toml").write_text(CONFIG)
    return root / "hotreload.toml"


def post(url: str, path: str, doc: Any, config: Path) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **http_headers(config)}
    status, _, body = request(url, path, json.dumps(doc).encode(), headers, timeout=60)
    return status, json.loads(body)


def kserve_logits(url: str, config: Path, adapter: str | None) -> tuple[int, Any]:
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "input_ids", "shape": list(IDS.shape), "datatype": "INT64",
             "data": IDS.ravel().tolist()}
        ]
    }  # fmt: skip
    if adapter is not None:
        doc["parameters"] = {"adapter": adapter}
    status, body = post(url, "/v2/models/lm/infer", doc, config)
    if status != 200:
        return status, body
    out = next(o for o in body["outputs"] if o["name"] == "logits")
    return status, np.array(out["data"], dtype=np.float32).reshape(out["shape"])


def logits(client: Client, adapter: str | None, **kw: Any) -> Any:
    params = {"adapter": adapter} if adapter is not None else None
    result = client.infer("lm", {"input_ids": IDS}, parameters=params, **kw)
    out = result.output["logits"] if isinstance(result.output, dict) else result.output
    return result, out


@pytest.fixture
def session(tmp_path: Path, serve: Any) -> Any:
    config = project(tmp_path)
    server = serve(config, "--no-tui", command="watch", process_cls=HttpServeProcess)
    with Client(config=config, timeout_s=90) as client:
        yield config, server, client


def test_adapters_per_request_on_every_front_a_save_and_a_push(session: Any) -> None:
    config, server, client = session
    root = config.parent
    want = {n: peft_logits(root, n) for n in ("a", "b")}
    want["base"] = peft_logits(root, None)
    for name in ("b", "a", "base", "b"):
        np.testing.assert_allclose(logits(client, name)[1], want[name], **TOL)
    np.testing.assert_allclose(logits(client, None)[1], want["a"], **TOL)  # first declared
    with pytest.raises(BadRequestError, match=r"unknown adapter 'c'; this model serves: a, b"):
        logits(client, "c")
    # KServe v2 HTTP: `parameters.adapter`; an unknown one is a 400 naming the known ones.
    status, got = kserve_logits(server.url, config, "b")
    assert status == 200
    np.testing.assert_allclose(got, want["b"], **TOL)
    status, body = kserve_logits(server.url, config, "zz")
    assert status == 400 and "this model serves: a, b, base" in body["error"]
    # /v1/completions: `model` names "<model>:<adapter>", as lm-eval's model= can.
    doc = {"prompt": IDS[0].tolist(), "max_tokens": 0, "echo": True, "logprobs": 1}
    status, body = post(server.url, "/v1/completions", {**doc, "model": "lm:b"}, config)
    assert status == 200 and body["model"] == "lm:b", body
    got_lp = body["choices"][0]["logprobs"]["token_logprobs"][1:]
    ref = torch.from_numpy(want["b"][0]).log_softmax(-1)
    expected = [float(ref[i, IDS[0, i + 1]]) for i in range(IDS.shape[1] - 1)]
    np.testing.assert_allclose(got_lp, expected, rtol=1e-4, atol=1e-4)
    status, body = post(server.url, "/v1/completions", {**doc, "model": "lm:zz"}, config)
    assert status == 400 and "unknown adapter 'zz'" in json.dumps(body)
    # Digests: one per adapter, the base's, the whole's; in status and model metadata.
    m = client.status()["models"][0]
    digests = {n: a["digest"] for n, a in m["adapters"]["adapters"].items()}
    assert len(set(digests.values())) == 2 and m["adapters"]["default"] == "a"
    assert m["digest"].startswith("sha256:") and m["adapters"]["base_digest"].startswith("sha256:")
    status, _, body = request(server.url, "/v2/models/lm", headers=http_headers(config))
    meta = json.loads(body)
    assert meta["parameters"]["adapters"]["adapters"]["b"]["digest"] == digests["b"]
    # One session for both halves: a session and its project take most of the time.
    check_an_adapter_save_then_a_push(config, client)


def check_an_adapter_save_then_a_push(config: Path, client: Client) -> None:
    """An adapter save reloads that adapter only; a push of adapter tensors alone serves."""
    root = config.parent
    before = client.status()["models"][0]
    save_adapter(root, "b", 7)
    result, got = logits(client, "b", min_version=2)
    assert result.version == 2
    np.testing.assert_allclose(got, peft_logits(root, "b"), **TOL)
    np.testing.assert_allclose(logits(client, "a")[1], peft_logits(root, "a"), **TOL)
    done = [e for e in read_events(config) if e["kind"] == "reload_done"]
    assert done and done[-1].get("version") == 2
    loads = [e for e in read_events(config) if e["kind"] == "phase_end" and e["phase"] == "load"]
    assert (
        "weights only" in loads[-1]["detail"] and "shared with the serving" in loads[-1]["detail"]
    )
    after = client.status()["models"][0]
    a0, a1 = (s["adapters"]["adapters"]["a"] for s in (before, after))
    b0, b1 = (s["adapters"]["adapters"]["b"] for s in (before, after))
    assert a1["digest"] == a0["digest"] and a1["source"] == "shared"
    assert b1["digest"] != b0["digest"] and b1["source"] == "file"
    assert after["adapters"]["base_digest"] == before["adapters"]["base_digest"]
    assert after["digest"] != before["digest"]

    # A push of adapter tensors alone: a's named as peft's save_pretrained writes them (no
    # adapter name: the default adapter), b's as a peft model trained as "b" holds them.
    from safetensors.torch import load_file

    def saved(name: str) -> dict[str, Any]:
        return load_file(str(root / "adapters" / name / "adapter_model.safetensors"))

    new_a = {k: v * 0.5 for k, v in saved("a").items()}
    new_b = {k.replace(".weight", ".b.weight"): v * 2.0 for k, v in saved("b").items()}
    reply = client.update_weights("lm", {**new_a, **new_b}, strict=False)
    assert reply["version"] == 3
    sources = {n: a["source"] for n, a in reply["adapters"]["adapters"].items()}
    assert sources == {"a": "shared+push", "b": "shared+push"}, sources
    for name, state in (("a", new_a), ("b", {k: v * 2.0 for k, v in saved("b").items()})):
        ref_model = peft.PeftModel.from_pretrained(base_model(root), root / "adapters" / name)
        peft.set_peft_model_state_dict(ref_model, state)
        with torch.inference_mode():
            ref = ref_model.eval()(input_ids=torch.from_numpy(IDS)).logits.numpy()
        result, got = logits(client, name, min_version=3)
        np.testing.assert_allclose(got, ref, **TOL)
    assert count_events(config, "reload_done", trigger="push") == 1

"""The models people actually edit, built from transformers configs with random weights (no
download): any sequence length, text in and out, Hugging Face output structures, bfloat16,
and the dev loop on examples/tiny_lm (edits and a push mid-run, a broken edit). Each served
answer is compared with the same model called in this process."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotreload import AsyncClient, Client
from hotreload.client import http_headers
from hotreload.errors import BadRequestError, ConfigError
from hotreload.protocol.messages import SHAPES_REFUSED
from tests.http.conftest import HttpServeProcess
from tests.http.support_http import json_infer, request
from tests.support import REPO, count_events, shared_server

transformers = pytest.importorskip("transformers")
import tritonclient.http as httpclient  # noqa: E402

TINY_LM = REPO / "examples" / "tiny_lm"

ENCODER = """
import torch
from transformers import BertConfig, BertModel

def build():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128)
    return BertModel(config).eval()

def example():
    ids = torch.arange(16).reshape(1, 16) % 300
    return {"input_ids": ids, "attention_mask": torch.ones(1, 16, dtype=torch.long)}
"""

CAUSAL = """
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

def build():
    torch.manual_seed(0)
    # The default config: use_cache=True, so the output holds a DynamicCache.
    config = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         output_hidden_states=True)
    return Qwen2ForCausalLM(config).eval()

def example():
    return {"input_ids": torch.arange(8).reshape(1, 8)}
"""

ODD_OUTPUTS = """
import torch

class Odd(torch.nn.Module):
    def forward(self, x):
        return {"scores": x * 2, "half": (x / 2).to(torch.bfloat16), "skipped": None,
                "nested": {"sum": x.sum(dim=1), "parts": (x[:, :1], x[:, 1:])}}

def build():
    return Odd()

def example():
    return torch.ones(1, 4)
"""


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def project(tmp_path: Path, config: str, files: dict[str, str]) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir(parents=True)
    for name, text in files.items():
        (proj / name).write_text(text)
    (proj / "hotreload.toml").write_text(config)
    return proj / "hotreload.toml"


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServeProcess]:
    """One examples/tiny_lm session for the module's tiny_lm tests: the one that edits its
    code and pushes its weights comes after the one that only asks it."""
    proj = tmp_path_factory.mktemp("tiny") / "tiny_lm"
    shutil.copytree(TINY_LM, proj, ignore=shutil.ignore_patterns("__pycache__", ".hotreload"))
    with shared_server(proj / "hotreload.toml", process_cls=HttpServeProcess) as server:
        yield server


def test_tiny_lm_prompts_in_text_out_over_every_client(tiny_lm: Any) -> None:
    module = load_module(tiny_lm.config.parent / "model.py", "hr_tiny_lm_model")
    model = module.build()
    prompts = ["Hi", "A much longer prompt than the first one", "Once upon a time"]

    def in_process(batch: list[str], n: int) -> list[str]:
        with torch.inference_mode():
            return model(batch, max_new_tokens=n)

    client = Client(config=tiny_lm.config, timeout_s=60)
    texts, version, _ = client.infer("gen", prompts, parameters={"max_new_tokens": 5})
    assert texts == in_process(prompts, 5) and version == 1
    assert all(len(t) == 5 for t in texts)
    # One prompt alone: a str in, a str out, the same answer as inside a batch.
    assert client.infer("gen", prompts[1], parameters={"max_new_tokens": 5}).output == texts[1]
    with pytest.raises(BadRequestError, match=r"does not take parameter\(s\) \['temperature'\]"):
        client.infer("gen", prompts, parameters={"temperature": 0.5})

    async def through_async() -> list[str]:
        async with AsyncClient(config=tiny_lm.config) as aclient:
            r = await aclient.infer("gen", prompts, parameters={"max_new_tokens": 3})
            return r.output

    import asyncio

    assert asyncio.run(asyncio.wait_for(through_async(), 60)) == in_process(prompts, 3)

    # KServe BYTES: tritonclient binary, then JSON (curl-style) with parameters.
    triton = httpclient.InferenceServerClient(url=tiny_lm.address, network_timeout=60)
    try:
        inp = httpclient.InferInput("input", [len(prompts)], "BYTES")
        inp.set_data_from_numpy(np.array(prompts, dtype=object))
        result = triton.infer("gen", [inp], parameters={"max_new_tokens": 4})
        assert [v.decode() for v in result.as_numpy("output")] == in_process(prompts, 4)
        meta = triton.get_model_metadata("gen")
        assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
    finally:
        triton.close()
    body = json.dumps(
        {
            "inputs": [{"name": "input", "datatype": "BYTES", "shape": [2], "data": prompts[:2]}],
            "parameters": {"max_new_tokens": 6},
        }
    ).encode()
    status, _, answer = request(tiny_lm.url, "/v2/models/gen/infer", body)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == in_process(prompts[:2], 6)


def test_tiny_lm_edits_and_pushes_go_live_and_a_broken_edit_keeps_serving(
    tiny_lm: HttpServeProcess,
) -> None:
    """The dev loop on one session: a sampling edit reloaded over the socket client; then,
    over HTTP, an edit and a push mid-run change the version that answers /v1/completions,
    and a broken edit keeps the old one answering. (It edits and pushes to the module's
    session: the other tiny_lm test comes before it.)"""
    check_a_sampling_edit_goes_live(tiny_lm)
    check_edits_and_pushes_mid_run_change_who_answers(tiny_lm)


def check_a_sampling_edit_goes_live(tiny_lm: HttpServeProcess) -> None:
    client = Client(config=tiny_lm.config, timeout_s=60)
    before = client.infer("gen", ["Hello"], parameters={"max_new_tokens": 6}).output
    code = tiny_lm.config.parent / "model.py"
    code.write_text(code.read_text().replace("TOP_K = 1\n", "TOP_K = 2\n"))
    outcome = client.reload("gen")["outcomes"][0]
    assert outcome["ok"], outcome
    after, version, _ = client.infer("gen", ["Hello"], parameters={"max_new_tokens": 6})
    assert version == 2 and after != before
    module = load_module(code, "hr_tiny_lm_edited")
    with torch.inference_mode():
        assert after == module.build()(["Hello"], max_new_tokens=6)


def post(url: str, path: str, doc: Any, extra: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/json", **extra}
    status, got, body = request(url, path, json.dumps(doc).encode(), headers, timeout=60)
    return status, got, json.loads(body)


def check_edits_and_pushes_mid_run_change_who_answers(server: HttpServeProcess) -> None:
    proj = server.config.parent
    token = http_headers(proj / "hotreload.toml")  # the repository routes need the token
    ask = {"model": "gen", "prompt": "Hello", "max_tokens": 6, "temperature": 0}

    def answer() -> tuple[str, int, str]:
        status, headers, doc = post(server.url, "/v1/completions", ask, {})
        assert status == 200, doc
        assert headers["X-Hotreload-Version"] == str(doc["model_version"])
        return doc["choices"][0]["text"], doc["model_version"], doc["system_fingerprint"]

    text1, v1, d1 = answer()
    code = proj / "model.py"
    code.write_text(code.read_text().replace("SEED = 0\n", "SEED = 1\n"))
    status, _, load = post(server.url, "/v2/repository/models/gen/load", {}, token)
    assert status == 200, load
    text2, v2, d2 = answer()
    assert (v2, text2 != text1, d2 != d1) == (v1 + 1, True, True)

    good = code.read_text()
    code.write_text(good + "\ndef broken(:\n")
    status, _, failed = post(server.url, "/v2/repository/models/gen/load", {}, token)
    assert status == 500 and "keeps serving" in failed["error"]
    assert answer() == (text2, v2, d2)

    # The edit fixed, a trainer pushes weights: min_version parks the request until that
    # version serves, and the answer names it.
    code.write_text(good)
    client = Client(config=proj / "hotreload.toml", timeout_s=60)
    state = load_module(code, "hr_tiny_lm_pushed").build().state_dict()
    pushed = client.update_weights("gen", {k: v * 0.5 for k, v in state.items()})
    ask["min_version"] = pushed["version"]
    text3, v3, d3 = answer()
    assert v3 == pushed["version"] and d3 == pushed["digest"] and text3 != text2


#: The encoder, the causal LM and the odd outputs in one session: their tests only ask it.
MODELS_CONFIG = """
[[models]]
name = "enc"
entry = "enc.py:build"
example = "enc.py:example"
threads = 1
warmup_iters = 1
shapes = { input_ids = [-1, -1], attention_mask = [-1, -1] }

[[models]]
name = "lm"
entry = "lm.py:build"
example = "lm.py:example"
threads = 1
warmup_iters = 1
shapes = { input_ids = [-1, -1] }

[[models]]
name = "odd"
entry = "odd.py:build"
example = "odd.py:example"
threads = 1
warmup_iters = 1
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServeProcess]:
    """One session serving "enc", "lm" and "odd" for the tests that only send it requests:
    a session with its workers costs more than their requests."""
    config = project(
        tmp_path_factory.mktemp("models"),
        MODELS_CONFIG,
        {"enc.py": ENCODER, "lm.py": CAUSAL, "odd.py": ODD_OUTPUTS},
    )
    with shared_server(config, process_cls=HttpServeProcess) as server:
        yield server


def test_an_encoder_takes_any_sequence_length_it_declares(models: HttpServeProcess) -> None:
    server, config = models, models.config
    assert "inputs input_ids [-1, -1], attention_mask [-1, -1]" in server.output
    model = load_module(config.parent / "enc.py", "hr_encoder").build()
    client = Client(config=config, timeout_s=60)
    rng = np.random.default_rng(0)
    for length in (3, 16, 77):
        ids = rng.integers(0, 300, (2, length), dtype=np.int64)
        mask = np.ones((2, length), np.int64)
        mask[1, length // 2 :] = 0
        out, _, _ = client.infer("enc", {"input_ids": ids, "attention_mask": mask})
        with torch.inference_mode():
            ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        assert sorted(out) == ["last_hidden_state", "pooler_output"]
        np.testing.assert_allclose(out["last_hidden_state"], ref.last_hidden_state, atol=1e-4)
        np.testing.assert_allclose(out["pooler_output"], ref.pooler_output, atol=1e-4)
    triton = httpclient.InferenceServerClient(url=server.address, network_timeout=60)
    try:
        meta = triton.get_model_metadata("enc")
    finally:
        triton.close()
    assert [i["shape"] for i in meta["inputs"]] == [[-1, -1], [-1, -1]]
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {
        "last_hidden_state": [-1, -1, -1],
        "pooler_output": [-1, -1],
    }
    # A rank the declaration does not allow is refused, naming what is wrong.
    with pytest.raises(BadRequestError, match=r"input_ids: expected shape \[-1, -1\]"):
        client.infer("enc", {"input_ids": np.zeros((1, 2, 3), np.int64), "attention_mask": mask})


def test_hugging_face_outputs_are_flattened_and_a_cache_is_left_out_once(
    models: HttpServeProcess,
) -> None:
    session, config = models, models.config
    assert "note: output field(s) 'cache' (DynamicCache) cannot travel" in session.output
    assert "use_cache=False" in session.output
    model = load_module(config.parent / "lm.py", "hr_causal").build()
    client = Client(config=config, timeout_s=60)
    ids = np.array([[5, 9, 2, 7, 1, 3, 3, 4, 100, 0, 11]], np.int64)
    out, _, _ = client.infer("lm", {"input_ids": ids})
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor(ids))
    assert "cache" not in out
    np.testing.assert_allclose(out["logits"], ref.logits, atol=1e-4)
    assert [k for k in out if k.startswith("hidden_states.")] == [
        f"hidden_states.{i}" for i in range(len(ref.hidden_states))
    ]
    np.testing.assert_allclose(out["hidden_states.2"], ref.hidden_states[2], atol=1e-4)
    client.infer("lm", {"input_ids": ids[:, :4]})
    assert count_events(config, "model_note", model="lm") == 1  # said once, not per request


def test_nested_none_and_bfloat16_outputs_travel(models: HttpServeProcess) -> None:
    server, config = models, models.config
    x = np.array([[1.0, 2.5, -3.0, 0.1]], np.float32)
    client = Client(config=config)
    out, _, _ = client.infer("odd", x)
    assert sorted(out) == ["half", "nested.parts.0", "nested.parts.1", "nested.sum", "scores"]
    want_half = (torch.tensor(x) / 2).to(torch.bfloat16)
    assert out["half"].dtype == np.float32
    np.testing.assert_array_equal(out["half"], want_half.float().numpy())
    raw = client.infer("odd", x, raw=True).output["half"]
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, want_half.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(out["nested.parts.1"], x[:, 1:])
    body = json_infer(x.ravel().tolist(), [1, 4])
    status, _, body = request(server.url, "/v2/models/odd/infer", body)
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert status == 200 and outputs["half"]["datatype"] == "BF16"
    assert outputs["half"]["data"] == want_half.float().ravel().tolist()


WRONG_SHAPES = [
    ("{ tokens = [-1, -1] }", "`shapes` names 'tokens', but the example's inputs are"),
    ("{ input_ids = [-1] }", "shapes.input_ids = [-1] has 1 dimension(s)"),
    ("{ input_ids = [-1, 8] }", "fixes dimension 1 at 8, but the example's 'input_ids'"),
]


@pytest.mark.parametrize(("shapes", "message"), WRONG_SHAPES)
def test_a_wrong_shapes_declaration_is_refused_saying_why(shapes: str, message: str) -> None:
    """Each wrong declaration against the encoder's own example, through the worker's
    check (a SignatureError); the test below sees one fail a real session's start."""
    import tomllib

    from hotreload.worker.signatures import (
        SignatureError,
        input_signature,
        normalise_example,
    )

    encoder = types.ModuleType("hr_encoder_example")
    exec(ENCODER, encoder.__dict__)
    declared = tomllib.loads(f"shapes = {shapes}")["shapes"]
    form, named = normalise_example(encoder.example())
    with pytest.raises(SignatureError) as refused:
        input_signature(named, form, declared)
    assert message in str(refused.value)


#: A torch-only stand-in with the encoder's example (any sequence length), for the tests of
#: `shapes` itself in a real worker: what they prove is not the model, and a worker that
#: imports transformers costs seconds more. Its outputs are shaped as BERT's are: one per
#: token ([1, L, 8], following the input's length) and one pooled ([1, 8]).
TOKENS_MODEL = """
import torch

class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(300, 8)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        hidden = self.embed(input_ids) * mask
        pooled = hidden.sum(1) / mask.sum(1).clamp(min=1)
        return {"last_hidden_state": hidden, "pooler_output": pooled}

def build():
    torch.manual_seed(0)
    return Pool().eval()

def example():
    ids = torch.arange(16).reshape(1, 16) % 300
    return {"input_ids": ids, "attention_mask": torch.ones(1, 16, dtype=torch.long)}
"""

#: The same, but it only takes the example's sequence length, whatever `shapes` says.
FIXED_LENGTH_MODEL = TOKENS_MODEL.replace(
    "        mask = ", '        assert input_ids.shape[1] == 16, "only 16 tokens"\n        mask = '
)


def model_section(name: str, file: str, shapes: str) -> str:
    return (
        f'[[models]]\nname = "{name}"\nentry = "{file}:build"\nexample = "{file}:example"\n'
        f"threads = 1\nwarmup_iters = 1\nshapes = {shapes}\n\n"
    )


def test_a_wrong_shapes_declaration_fails_the_start_and_says_why(tmp_path: Path, serve) -> None:
    shapes, message = WRONG_SHAPES[0]
    config = project(tmp_path, model_section("enc", "enc.py", shapes), {"enc.py": TOKENS_MODEL})
    session = serve(config, wait_ready=False)
    session.wait_for(f"{SHAPES_REFUSED}: {message}", 90)  # the config's, not the example's


def test_shapes_values_are_checked_in_the_config(tmp_path: Path) -> None:
    from hotreload.config import parse_config

    model = {"name": "m", "entry": "m:build", "example": "m:ex", "shapes": {"input": [0, 4]}}
    with pytest.raises(ConfigError, match="use -1 for any size"):
        parse_config({"models": [model]}, path=tmp_path / "hotreload.toml")


def test_check_tries_the_declared_dynamic_dimensions_at_another_size(tmp_path: Path) -> None:
    """One `hotreload check` of two models declaring the same dynamic dimensions: "enc" takes
    another size, "fixed" fails at it (each model is checked in a worker of its own)."""
    import subprocess

    dynamic_shapes = "{ input_ids = [-1, -1], attention_mask = [-1, -1] }"
    config = project(
        tmp_path,
        model_section("enc", "enc.py", dynamic_shapes)
        + model_section("fixed", "fixed.py", dynamic_shapes),
        {"enc.py": TOKENS_MODEL, "fixed.py": FIXED_LENGTH_MODEL},
    )
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "check", "--reloads", "0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=config.parent,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    # Only "fixed" failed: "enc" passed every step (its own check would exit with 0).
    assert "hotreload check: FAIL: fixed (" in out.stdout, out.stdout
    enc, fixed = out.stdout.split("\nfixed on ")
    # At 15 tokens as at the example's 16, one output following the length, one not.
    outputs = "last_hidden_state float32[1, 16, 8], pooler_output float32[1, 8]"
    dynamic = "dynamic input_ids [-1, -1], attention_mask [-1, -1]"
    assert f"{outputs}; {dynamic}: ok at [[1, 15], [1, 15]]" in enc, out.stdout
    assert "the model failed for inputs of shape [[1, 15], [1, 15]]" in fixed, out.stdout


def test_demo_traffic_stand_ins_cover_strings_and_bfloat16() -> None:
    from hotreload.protocol.tensors import encode_tensors
    from hotreload.tui.loadgen import example_inputs

    text = example_inputs("single", [{"name": "input", "dtype": "bytes", "shape": [1]}])
    assert text.tolist() == ["a"]
    both = example_inputs(
        "dict",
        [
            {"name": "h", "dtype": "bfloat16", "shape": [3, 8]},
            {"name": "ids", "dtype": "int64", "shape": [1, 16], "dims": [-1, -1]},
        ],
    )
    metas, _ = encode_tensors(both)
    assert [(m["dtype"], m["shape"]) for m in metas] == [("bfloat16", [1, 8]), ("int64", [1, 16])]

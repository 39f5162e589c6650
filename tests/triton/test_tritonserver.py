"""The export on the real thing: `hotreload export triton`, then the nvidia-pytriton wheel's
tritonserver 2.51 on the repository, asked by tritonclient, answering what hotreload answers
for the same inputs (the same client against both servers)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.http.conftest import HttpServeProcess
from tests.support import REPO
from tests.triton.support_triton import SHARED, TritonProcess, start_triton

pytest.importorskip("transformers")
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(600)]

SEQ = '''
import torch

class Seq(torch.nn.Module):
    """Token ids and a mask of any length in, per-token and pooled features out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, input_ids, attention_mask, scale: float = 1.0):
        h = self.proj(self.emb(input_ids)) * attention_mask[..., None] * scale
        return {"hidden": h, "pooled": {"sum": h.sum(1), "max": h.amax(1)}, "none": None}

def build():
    return Seq()

def example():
    return {"input_ids": torch.arange(6).reshape(1, 6),
            "attention_mask": torch.ones(1, 6, dtype=torch.long)}
'''

BAD = """
import torch

#: The exported copy has this set to True, as an edit would.
BROKEN = False

def build():
    if BROKEN:
        raise ValueError("checkpoint layout changed: no layer 'blocks.9'")
    return torch.nn.Linear(4, 2)

def example():
    return torch.ones(1, 4)
"""

TIED = '''
import torch

class Inner(torch.nn.Module):
    """An embedding tied to the output head: the weights file stores it once."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 6)
        self.head = torch.nn.Linear(6, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))

class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, ids):
        return self.inner(ids)

def build():
    return Wrapper()

def example():
    return torch.arange(5).reshape(1, 5)
'''

SCRIPTED = """
import torch

def example_input():
    return torch.ones(1, 3)
"""


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0 + 1.0


def make_weights_and_archive(proj: Path) -> torch.Tensor:
    """tied/weights.safetensors (keys without the wrapper's prefix, the tied group stored
    once) and ts/model.pt (a TorchScript archive); returns the embedding's values."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(7)
    embed = torch.randn(20, 6, generator=g)
    save_file({"embed.weight": embed}, str(proj / "tied" / "weights.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.save(torch.jit.script(Scaled()), str(proj / "ts" / "model.pt"))
    return embed


# Every model has `threads`: torch's default thread count differs between a Triton stub and
# a hotreload worker, and a GEMM split over other threads rounds differently (last bit).
CONFIG = """
[[models]]
name = "mlp"
entry = "mlp/model.py:build"
example = "mlp/model.py:example_input"
weights = ["mlp/weights.safetensors"]
threads = 1

[[models]]
name = "gen"
entry = "tiny_lm/model.py:build"
example = "tiny_lm/model.py:example"
threads = 1
warmup_iters = 1

[[models]]
name = "seq"
entry = "seq/model.py:build"
example = "seq/model.py:example"
device = "cpu"
threads = 1
shapes = { input_ids = [-1, -1], attention_mask = [-1, -1] }

[[models]]
name = "tied"
entry = "tied/model.py:build"
example = "tied/model.py:example"
weights = ["tied/weights.safetensors"]
weights_prefix = "inner."
device = "cpu"
threads = 1

[[models]]
name = "ts"
entry = "ts/model.pt"
example = "ts/example.py:example_input"
device = "cpu"

[[models]]
name = "bad"
entry = "bad/model.py:build"
example = "bad/model.py:example"
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The project (mlp, tiny LM, a sequence model, one to break), exported to a repo."""
    root = tmp_path_factory.mktemp("triton")
    proj = root / "proj"
    ignore = shutil.ignore_patterns("__pycache__", ".hotreload")
    shutil.copytree(REPO / "examples" / "mlp", proj / "mlp", ignore=ignore)
    shutil.copytree(REPO / "examples" / "tiny_lm", proj / "tiny_lm", ignore=ignore)
    for name, text in (("seq", SEQ), ("bad", BAD), ("tied", TIED)):
        (proj / name).mkdir()
        (proj / name / "model.py").write_text(text)
    (proj / "ts").mkdir()
    (proj / "ts" / "example.py").write_text(SCRIPTED)
    make_weights_and_archive(proj)
    (proj / "hotreload.toml").write_text(CONFIG)
    repo = root / "repo"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hotreload",
            "export",
            "triton",
            str(repo),
            "--config",
            str(proj / "hotreload.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    broken = repo / "bad" / "1" / "code" / "model.py"
    broken.write_text(broken.read_text().replace("BROKEN = False", "BROKEN = True"))
    return proj / "hotreload.toml", repo, done.stdout


def wait_loaded(
    client: httpclient.InferenceServerClient,
    server: TritonProcess,
    names: set[str],
    timeout: float = 240,
) -> dict[str, dict[str, Any]]:
    """Poll the repository index until every model in `names` is READY or UNAVAILABLE."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"tritonserver exited:\n{server.log_text()[-4000:]}")
        try:
            index = {m["name"]: m for m in client.get_model_repository_index()}
        except Exception:
            index = {}  # not listening yet
        states = {n: index.get(n, {}).get("state") for n in names}
        if all(s in ("READY", "UNAVAILABLE") for s in states.values()):
            return {n: index[n] for n in names}
        time.sleep(0.5)
    raise AssertionError(f"models not loaded after {timeout} s:\n{server.log_text()[-4000:]}")


@pytest.fixture(scope="module")
def triton(local_triton: Any, exported: tuple[Path, Path, str]) -> Iterator[Any]:
    _, repo, _ = exported
    server = start_triton(local_triton, repo, repo.parent)
    try:
        client = httpclient.InferenceServerClient(server.http, network_timeout=120)
        index = wait_loaded(client, server, {"mlp", "gen", "seq", "tied", "ts", "bad"})
        yield client, server, index
    finally:
        server.close()


@pytest.fixture(scope="module")
def hotreload_http(exported: tuple[Path, Path, str]) -> Iterator[httpclient.InferenceServerClient]:
    config, _, _ = exported
    proc = HttpServeProcess(config)
    SHARED.add(proc.proc.pid)
    try:
        proc.wait_ready(240)
        yield httpclient.InferenceServerClient(proc.address, network_timeout=120)
    finally:
        proc.close()
        SHARED.discard(proc.proc.pid)


def infer(
    client: httpclient.InferenceServerClient,
    model: str,
    inputs: dict[str, np.ndarray],
    **kwargs: Any,
) -> httpclient.InferResult:
    wire = []
    for name, arr in inputs.items():
        dtype = (
            "BYTES"
            if arr.dtype == object
            else {"float32": "FP32", "int64": "INT64"}[arr.dtype.name]
        )
        i = httpclient.InferInput(name, list(arr.shape), dtype)
        i.set_data_from_numpy(arr)
        wire.append(i)
    return client.infer(model, wire, **kwargs)


def test_the_export_says_what_it_wrote_and_what_triton_needs(
    exported: tuple[Path, Path, str],
) -> None:
    _, repo, printed = exported
    assert sorted(p.name for p in repo.iterdir()) == ["bad", "gen", "mlp", "seq", "tied", "ts"]
    assert "exported 'gen'" in printed and "request parameters reach the model" in printed
    assert "transformers==" in printed and "torch==" in printed


def test_triton_loads_the_exports_and_reports_ready(triton: Any) -> None:
    client, _, index = triton
    for name in ("mlp", "gen", "seq", "tied", "ts"):
        assert index[name]["state"] == "READY", index[name]
        assert client.is_model_ready(name)
    meta = client.get_model_metadata("seq")
    assert {i["name"]: i["shape"] for i in meta["inputs"]} == {
        "input_ids": ["-1", "-1"],
        "attention_mask": ["-1", "-1"],
    } or {i["name"]: i["shape"] for i in meta["inputs"]} == {
        "input_ids": [-1, -1],
        "attention_mask": [-1, -1],
    }
    assert [o["name"] for o in meta["outputs"]] == ["hidden", "pooled.sum", "pooled.max"]


def test_a_factory_that_raises_is_a_load_failure_with_the_users_traceback(triton: Any) -> None:
    client, server, index = triton
    assert index["bad"]["state"] == "UNAVAILABLE"
    reason = index["bad"].get("reason", "") + server.log_text()
    assert "checkpoint layout changed: no layer 'blocks.9'" in reason
    assert 'code/model.py", line 9, in build' in reason
    with pytest.raises(InferenceServerException):
        infer(client, "bad", {"input": np.ones((1, 4), np.float32)})


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_mlp_answers_equal_hotreloads(triton: Any, hotreload_http: Any, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 64), dtype=np.float32)
    got = infer(triton[0], "mlp", {"input": x}).as_numpy("output")
    want = infer(hotreload_http, "mlp", {"input": x}).as_numpy("output")
    assert got.shape == (batch, 10)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("batch", "length"), [(1, 3), (2, 6), (4, 17)])
def test_sequence_model_answers_equal_hotreloads_at_any_length(
    triton: Any, hotreload_http: Any, batch: int, length: int
) -> None:
    rng = np.random.default_rng(length)
    inputs = {
        "input_ids": rng.integers(0, 50, (batch, length)).astype(np.int64),
        "attention_mask": (rng.random((batch, length)) > 0.2).astype(np.int64),
    }
    for params in ({}, {"scale": 0.5}):
        got = infer(triton[0], "seq", inputs, parameters=params)
        want = infer(hotreload_http, "seq", inputs, parameters=params)
        for name in ("hidden", "pooled.sum", "pooled.max"):
            np.testing.assert_array_equal(got.as_numpy(name), want.as_numpy(name), err_msg=name)
        assert got.as_numpy("hidden").shape == (batch, length, 4)


@pytest.mark.parametrize(
    ("prompts", "tokens"),
    [(["Hello"], 4), (["Once upon a time", "é ünïcode", "a"], 9), (["x" * 40] * 5, 2)],
)
def test_tiny_lm_text_answers_equal_hotreloads(
    triton: Any, hotreload_http: Any, prompts: list[str], tokens: int
) -> None:
    arr = np.array(prompts, dtype=object)
    got = infer(triton[0], "gen", {"input": arr}, parameters={"max_new_tokens": tokens})
    want = infer(hotreload_http, "gen", {"input": arr}, parameters={"max_new_tokens": tokens})
    texts = [t.decode() for t in got.as_numpy("output").tolist()]
    assert texts == [t.decode() for t in want.as_numpy("output").tolist()]
    assert [len(t) for t in texts] == [tokens] * len(prompts)


def test_hotreloads_weight_rules_hold_tied_weights_a_prefix_and_torchscript(
    triton: Any, hotreload_http: Any, exported: tuple[Path, Path, str]
) -> None:
    config, _, _ = exported
    ids = np.array([[1, 2, 3, 19, 0], [4, 4, 4, 4, 4]], dtype=np.int64)
    got = infer(triton[0], "tied", {"input": ids}).as_numpy("output")
    want = infer(hotreload_http, "tied", {"input": ids}).as_numpy("output")
    np.testing.assert_array_equal(got, want)
    embed = make_weights_and_archive(config.parent).numpy()  # the same seeded values
    np.testing.assert_allclose(got, embed[ids] @ embed.T, rtol=1e-5, atol=1e-5)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = infer(triton[0], "ts", {"input": x}).as_numpy("output")
    np.testing.assert_array_equal(got, x * 3 + 1)
    np.testing.assert_array_equal(got, infer(hotreload_http, "ts", {"input": x}).as_numpy("output"))


def test_a_bad_request_fails_alone_with_the_models_message(triton: Any) -> None:
    client = triton[0]
    arr = np.array(["Hello"], dtype=object)
    with pytest.raises(InferenceServerException) as info:
        infer(client, "gen", {"input": arr}, parameters={"temperature": 2})
    assert "does not take parameter(s) ['temperature']; it takes " in str(info.value)
    assert "max_new_tokens" in str(info.value)
    # The instance still serves.
    ok = infer(client, "gen", {"input": arr}, parameters={"max_new_tokens": 3})
    assert len(ok.as_numpy("output")[0]) == 3


def test_model_option_exports_one_model_that_triton_serves(
    local_triton: Any, exported: tuple[Path, Path, str], tmp_path: Path
) -> None:
    config, _, _ = exported
    repo = tmp_path / "one"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hotreload",
            "export",
            "triton",
            str(repo),
            "--config",
            str(config),
            "--model",
            "mlp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in repo.iterdir()] == ["mlp"]
    record = json.loads((repo / "mlp" / "1" / "hotreload_export.json").read_text())
    assert record["weights"] == ["code/weights.safetensors"]
    server = start_triton(local_triton, repo, tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http, network_timeout=60)
        assert wait_loaded(client, server, {"mlp"})["mlp"]["state"] == "READY"
        x = np.ones((2, 64), np.float32)
        assert infer(client, "mlp", {"input": x}).as_numpy("output").shape == (2, 10)
    finally:
        server.close()

"""A build() that quantizes its module, with weights declared (issue 38, item 11).

`torch.ao.quantization.quantize_dynamic` returns a module whose state dict holds packed
parameters: a dtype and a tuple of tensors beside the quantized weight. Code that took
every state-dict value for a tensor failed the start with one line,
`AttributeError: 'torch.dtype' object has no attribute 'numel'`, and no traceback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hotreload.config import load_config
from hotreload.engine.session import Session
from hotreload.worker.weights_digest import state_digest

MODEL = """import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.relu(self.inp(x)))


def build():
    return torch.ao.quantization.quantize_dynamic(M(), {nn.Linear}, dtype=torch.qint8)


def example():
    return torch.ones(1, 8)
"""
X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)


def quantized(proj: Path, seed: int | None = None) -> torch.nn.Module:
    """The project's module built here (quantized), its float weights drawn from `seed`."""
    spec = importlib.util.spec_from_file_location("quantized_model", proj / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if seed is not None:
        torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 deprecates quantized tensor creation
        return module.build()


def save_quantized(proj: Path, seed: int) -> None:
    torch.save(quantized(proj, seed).state_dict(), proj / "q.pt")


def answer(proj: Path) -> np.ndarray:
    """What the model with q.pt's weights answers, computed here."""
    net = quantized(proj)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.load_state_dict(torch.load(proj / "q.pt", weights_only=True))
        with torch.no_grad():
            return net(torch.from_numpy(X)).numpy()


def project(tmp_path: Path, strategy: str, weights: str = "q.pt") -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "model.py").write_text(MODEL)
    save_quantized(proj, 0)
    floats = {"inp.weight": torch.zeros(16, 8), "inp.bias": torch.zeros(16)}
    save_file(floats, proj / "f.safetensors")
    (proj / "hotreload.toml").write_text(
        f"""[[models]]
name = "q"
entry = "model.py:build"
example = "model.py:example"
weights = ["{weights}"]
device = "cpu"
threads = 1
strategy = "{strategy}"
"""
    )
    return proj / "hotreload.toml"


async def infer(sup: Any) -> np.ndarray:
    from hotreload.protocol.tensors import decode_tensors, encode_tensors

    metas, blobs = encode_tensors({"x": X})
    frame = await sup.router.submit_future({"tensors": metas}, b"".join(bytes(b) for b in blobs))
    return next(iter(decode_tensors(frame.header["tensors"], frame.payload).values()))


def run_session(config_path: Path, scenario: Any) -> Any:
    config = load_config(config_path)

    async def main() -> Any:
        session = Session(config, endpoint=False, telemetry=False)
        try:
            await session.start()
            return await scenario(session, session.models["q"])
        finally:
            await session.stop()

    return asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.parametrize("strategy", ["inplace", "respawn"])
def test_a_quantized_module_starts_serves_its_weights_and_reloads(
    tmp_path: Path, strategy: str
) -> None:
    config = project(tmp_path, strategy)
    proj = config.parent

    async def scenario(session: Session, sup: Any) -> None:
        assert sup.state == "serving" and sup.version == 1, sup.last_error
        np.testing.assert_allclose(await infer(sup), answer(proj), rtol=1e-5, atol=1e-6)
        first = sup.current.digest
        # A code edit: the serving version's packed tensors cannot be shared, the file is read.
        (proj / "model.py").write_text(MODEL + "\nUNUSED = 1\n")
        edited = await session.reload_model("q", trigger="file", detail=["model.py"])
        assert edited.ok and edited.version == 2, edited
        assert sup.current.digest == first  # the same weights, the same digest
        # New weights: served, and a new digest.
        save_quantized(proj, 1)
        saved = await session.reload_model("q", trigger="file", detail=["q.pt"], weights_only=True)
        assert saved.ok and saved.version == 3, saved
        np.testing.assert_allclose(await infer(sup), answer(proj), rtol=1e-5, atol=1e-6)
        assert sup.current.digest != first

    run_session(config, scenario)


def test_float_weights_for_a_quantized_module_say_how_to_save_them(tmp_path: Path) -> None:
    config = project(tmp_path, "inplace", weights="f.safetensors")

    async def scenario(session: Session, sup: Any) -> None:
        raise AssertionError("the start must fail")

    with pytest.raises(Exception, match="weights do not match the model") as info:
        run_session(config, scenario)
    error = str(info.value)
    assert "inp._packed_params" in error and "quantized module" in error, error
    assert "torch.save(model.state_dict(), path)" in error, error


def test_the_digest_of_a_quantized_state_is_its_content(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    a, b = quantized(tmp_path, 0), quantized(tmp_path, 1)
    assert state_digest(a.state_dict()) == state_digest(quantized(tmp_path, 0).state_dict())
    assert state_digest(a.state_dict()) != state_digest(b.state_dict())


def test_an_exception_raised_in_hotreloads_own_code_keeps_its_frames() -> None:
    """A failure that is hotreload's (a bug, a model it does not handle yet) shows where it
    happened; one raised in the user's code still shows the user's frames only."""
    from hotreload.worker.fresh_source import read_from
    from hotreload.worker.replies import user_traceback

    def users_build() -> None:
        read_from([("only one path",)])  # type: ignore[list-item]

    def users_own_error() -> None:
        raise RuntimeError("the user's own")

    try:
        users_build()
    except ValueError as exc:
        ours = user_traceback(exc)
    try:
        users_own_error()
    except RuntimeError as exc:
        theirs = user_traceback(exc)
    assert "fresh_source.py" in ours and "users_build" in ours, ours
    assert "users_own_error" in theirs and "hotreload/worker" not in theirs, theirs

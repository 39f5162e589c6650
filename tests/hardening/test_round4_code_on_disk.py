"""The code a version runs is the code on disk when its build started (issue 38, item 10).

Real worker processes, real files, both strategies. A model whose output has K columns:
K = 3 changes its output shape, which the smoke test refuses.

- A refused edit, undone ("unchanged"), then a weights save: the save's build ran the
  refused code the failed build had left imported in the worker.
- An edit saved after a build's snapshot was taken but before the worker imported the code
  (the worker still starting, or the build waiting for its turn): the version ran the edit
  while its snapshot held the code before it, so the output gate then compared the edit
  with itself and let a changed output through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hotreload.config import load_config
from hotreload.engine.event_kinds import BaseEvent, Policy, State
from hotreload.engine.session import Session

MODEL = """import torch
from torch import nn

K = {k}


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x)[:, :K]


def build():
    return M()


def example():
    return torch.ones(1, 8)
"""
X = np.ones((1, 8), dtype=np.float32)
REFUSED = "output changed from output float32[1, 4] to output float32[1, 3]"


def save_weights(path: Path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    save_file({"lin.weight": torch.randn(4, 8, generator=g), "lin.bias": torch.zeros(4)}, path)


def project(tmp_path: Path, strategy: str) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "model.py").write_text(MODEL.format(k=4))
    save_weights(proj / "w.safetensors", 0)
    (proj / "hotreload.toml").write_text(
        f"""[[models]]
name = "m"
entry = "model.py:build"
example = "model.py:example"
weights = ["w.safetensors"]
device = "cpu"
threads = 1
strategy = "{strategy}"
"""
    )
    return proj / "hotreload.toml"


def set_k(config: Path, k: int) -> None:
    (config.parent / "model.py").write_text(MODEL.format(k=k))


async def infer(sup: Any) -> np.ndarray:
    from hotreload.protocol.tensors import decode_tensors, encode_tensors

    metas, blobs = encode_tensors({"x": X})
    frame = await sup.router.submit_future({"tensors": metas}, b"".join(bytes(b) for b in blobs))
    return next(iter(decode_tensors(frame.header["tensors"], frame.payload).values()))


def run_session(
    config_path: Path,
    scenario: Callable[[Session, Any], Any],
    on_event: Callable[[BaseEvent], None] | None = None,
) -> Any:
    config = load_config(config_path)

    async def main() -> Any:
        session = Session(config, endpoint=False, telemetry=False)
        if on_event is not None:
            session.events.subscribe(on_event)
        try:
            await session.start()
            return await scenario(session, session.models["m"])
        finally:
            await session.stop()

    return asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.parametrize("strategy", ["inplace", "respawn"])
def test_each_build_runs_the_code_on_disk_when_it_started(tmp_path: Path, strategy: str) -> None:
    """Three cases in turn, in one session. An edit saved while the first worker starts is
    the next version (refused by the output gate), not v1: the start's snapshot is taken
    before its worker starts (a second or more of torch's import). That refused edit undone
    ("unchanged"), then a weights save: the save's build runs the code on disk, not the
    refused code the failed build left imported. The other side of the rule: with a refused
    edit on disk, a weights save's build runs it too (and is refused the same way)."""
    config = project(tmp_path, strategy)
    edited_at_start: list[bool] = []

    def edit_once_started(event: BaseEvent) -> None:
        if isinstance(event, State) and event.state == "starting" and not edited_at_start:
            edited_at_start.append(True)
            set_k(config, 3)  # the snapshot is taken; the worker has not imported yet

    async def scenario(session: Session, sup: Any) -> None:
        assert edited_at_start and sup.version == 1 and (await infer(sup)).shape == (1, 4)
        edited = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert not edited.ok and REFUSED in (edited.error or ""), edited
        assert sup.version == 1 and (await infer(sup)).shape == (1, 4)

        set_k(config, 4)
        undone = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert undone.ok and undone.unchanged and undone.version == 1, undone
        save_weights(config.parent / "w.safetensors", 1)
        saved = await session.reload_model(
            "m", trigger="file", detail=["w.safetensors"], weights_only=True
        )
        assert saved.ok and saved.version == 2, saved
        assert (await infer(sup)).shape == (1, 4)  # K = 4, the code on disk

        set_k(config, 3)
        refused = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert not refused.ok, refused
        save_weights(config.parent / "w.safetensors", 2)
        saved = await session.reload_model(
            "m", trigger="file", detail=["w.safetensors"], weights_only=True
        )
        assert not saved.ok and REFUSED in (saved.error or ""), saved
        assert sup.version == 2 and (await infer(sup)).shape == (1, 4)

    run_session(config, scenario, edit_once_started)


def test_an_edit_saved_after_a_reloads_snapshot_waits_for_the_next_reload(
    tmp_path: Path,
) -> None:
    """The same within a reload: the edit lands between its snapshot and the worker's
    import (here: while it chooses its policy). The version built is the snapshot's code,
    and the next reload builds the edit."""
    config = project(tmp_path, "inplace")
    edits: list[int] = []

    def edit_during_the_reload(event: BaseEvent) -> None:
        if isinstance(event, Policy) and not edits:
            edits.append(2)
            (config.parent / "model.py").write_text(MODEL.format(k=4) + "\nK = 2\n")

    async def scenario(session: Session, sup: Any) -> None:
        (config.parent / "model.py").write_text(MODEL.format(k=4) + "\n# an edit\n")
        first = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert edits and first.ok and first.version == 2, first
        assert (await infer(sup)).shape == (1, 4)  # the snapshot's code, not K = 2
        second = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert not second.ok and "float32[1, 2]" in (second.error or ""), second

    run_session(config, scenario, edit_during_the_reload)


COPY_SCRIPT = """
import pathlib, sys, traceback
live, copy = pathlib.Path({live!r}), pathlib.Path({copy!r})
sys.path.insert(0, str(live))
from hotreload.worker.fresh_source import compile_from_source
compile_from_source([live], [[str(live), str(copy)]])
import mod
try:
    mod.fail()
except ValueError:
    shown = traceback.format_exc()
print(mod.V, mod.__file__ == str(live / "mod.py"), "raise ValueError(V)" in shown)
"""


def test_the_worker_compiles_the_snapshots_copy_under_the_live_files_name(
    tmp_path: Path,
) -> None:
    """The bytes are the snapshot's; `__file__`, and the lines a traceback shows, are the
    project's file as it was compiled."""
    import os
    import subprocess
    import sys

    from tests.support import REPO

    live, copy = tmp_path / "live", tmp_path / "copy"
    live.mkdir()
    copy.mkdir()
    (live / "mod.py").write_text("V = 'saved since'\n\n\ndef fail():\n    pass\n")
    (copy / "mod.py").write_text("V = 'snapshot'\n\n\ndef fail():\n    raise ValueError(V)\n")
    out = subprocess.run(
        [sys.executable, "-c", COPY_SCRIPT.format(live=str(live), copy=str(copy))],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["snapshot", "True", "True"], out.stdout


HOOKED = MODEL.replace(
    "def build():\n    return M()",
    "def build():\n    m = M()\n"
    "    # A forward hook: a push cannot copy the serving module's structure, so it calls\n"
    "    # build() (push_copy.py), from the modules the worker has imported.\n"
    "    m.register_forward_hook(lambda mod, args, out: out)\n    return m",
)


def test_a_push_after_a_refused_edit_undone_runs_the_serving_code(tmp_path: Path) -> None:
    """A push's build runs the serving version's code: under inplace a refused edit's
    modules stayed imported in the serving worker, and a push that calls build() (a hooked
    module) built from them, K = 3, refused by the output gate."""
    from hotreload.protocol.shared_state import pack_state

    config = project(tmp_path, "inplace")
    (config.parent / "model.py").write_text(HOOKED.format(k=4))

    async def scenario(session: Session, sup: Any) -> None:
        (config.parent / "model.py").write_text(HOOKED.format(k=3))
        refused = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert not refused.ok and REFUSED in (refused.error or ""), refused
        (config.parent / "model.py").write_text(HOOKED.format(k=4))
        undone = await session.reload_model("m", trigger="file", detail=["model.py"])
        assert undone.ok and undone.unchanged, undone
        weight = np.full((4, 8), 0.5, np.float32)
        with pack_state({"lin.weight": weight, "lin.bias": np.zeros(4, np.float32)}) as packed:
            pushed = await sup.push(packed.descriptor, strict=True)
        assert pushed["version"] == 2, pushed
        np.testing.assert_allclose(await infer(sup), X @ weight.T, rtol=1e-6)

    run_session(config, scenario)

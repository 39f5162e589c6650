"""A trainer's checkpoint still being written is waited for, never a failed reload.

Real worker processes and a real weights file, written in place in two halves (as a
non-atomic `save_file` or `torch.save` would) while the reload runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from hotreload.config import load_config
from hotreload.config.models import Deadlines
from hotreload.engine.event_kinds import BaseEvent, CheckpointWait, ReloadFailed
from hotreload.engine.model import ReloadOutcome
from hotreload.engine.session import Session
from tests.support import make_project

X = np.random.default_rng(11).standard_normal((1, 64), dtype=np.float32)


def doubled_weights(path: Path) -> bytes:
    state = safetensors.torch.load_file(str(path))
    return safetensors.torch.save({k: v * 2 for k, v in state.items()})


def write_slowly(path: Path, data: bytes, pause_s: float, finish: bool = True) -> threading.Thread:
    """Half of `data` into `path` at once (in place), the rest after `pause_s`."""
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])

    def rest() -> None:
        time.sleep(pause_s)
        if finish:
            with open(path, "ab") as f:
                f.write(data[len(data) // 2 :])

    thread = threading.Thread(target=rest, daemon=True)
    thread.start()
    return thread


def reload_during_write(
    tmp_path: Path, *, finish: bool, checkpoint_s: float
) -> tuple[ReloadOutcome, list[BaseEvent], np.ndarray, np.ndarray]:
    config = load_config(make_project(tmp_path))
    model = config.models[0]
    model = dataclasses.replace(model, deadlines=Deadlines(checkpoint_s=checkpoint_s))
    config = dataclasses.replace(config, models=(model,))
    weights = model.weights[0]
    new = doubled_weights(weights)

    async def scenario() -> tuple[ReloadOutcome, list[BaseEvent], np.ndarray, np.ndarray]:
        session = Session(config, endpoint=False, telemetry=False)
        seen: list[BaseEvent] = []
        session.events.subscribe(seen.append)
        try:
            await session.start()
            sup = session.models[model.name]
            before = await infer(sup)
            writer = write_slowly(weights, new, 1.0, finish)
            outcome = await session.reload_model(model.name, trigger="file", weights_only=True)
            writer.join(10)
            after = await infer(sup)
        finally:
            await session.stop()
        return outcome, seen, before, after

    return asyncio.run(asyncio.wait_for(scenario(), 120))


async def infer(sup) -> np.ndarray:  # type: ignore[no-untyped-def]
    from hotreload.protocol.tensors import decode_tensors, encode_tensors

    metas, blobs = encode_tensors({"x": X})
    frame = await sup.router.submit_future({"tensors": metas}, b"".join(bytes(b) for b in blobs))
    return next(iter(decode_tensors(frame.header["tensors"], frame.payload).values()))


def test_a_checkpoint_written_in_place_is_waited_for_and_then_loaded(tmp_path: Path) -> None:
    outcome, seen, before, after = reload_during_write(tmp_path, finish=True, checkpoint_s=30)
    assert outcome.ok and outcome.version == 2, outcome
    assert "checkpoint" in outcome.phases and outcome.phases["checkpoint"] >= 0.5
    waits = [e for e in seen if isinstance(e, CheckpointWait)]
    assert len(waits) == 1 and "still being written" in waits[0].message, waits
    assert [e.kind for e in seen if e.kind.startswith("reload_")][-1] == "reload_done"
    assert not any(isinstance(e, ReloadFailed) for e in seen)
    # The new (doubled) weights answer: the model is linear in its last layer's weights.
    assert not np.array_equal(after, before)


def test_a_checkpoint_never_finished_fails_its_phase_and_the_old_version_serves(
    tmp_path: Path,
) -> None:
    outcome, _, before, after = reload_during_write(tmp_path, finish=False, checkpoint_s=0.5)
    assert not outcome.ok and outcome.phase == "checkpoint", outcome
    assert "still incomplete after the 0.5 s checkpoint deadline" in (outcome.error or "")
    assert "rename it over the old one" in (outcome.error or "")
    assert outcome.version == 1
    np.testing.assert_array_equal(after, before)  # the old weights serve on, untouched


def test_torch_save_zip_cut_short_is_incomplete(tmp_path: Path) -> None:
    from hotreload.engine.checkpoint_ready import checkpoint_problem

    path = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(256, 256)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])
    assert "still being written" in (checkpoint_problem(path) or "")
    os.truncate(path, 0)
    path.write_bytes(data)
    assert checkpoint_problem(path) is None

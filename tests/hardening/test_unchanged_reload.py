"""A reload whose code and weights are the serving version's builds nothing (issue 30, 13).

Real worker processes, real files: `hotreload reload` twice, a save without a change, and a
checkpoint written in two halves (the watcher fires for each half; the first reload waits
for the whole file and serves it, the second must not rebuild it as one more version).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hotreload.config import load_config
from hotreload.config.models import Deadlines
from hotreload.engine.event_kinds import BaseEvent, ReloadDone
from hotreload.engine.model import ReloadOutcome
from hotreload.engine.session import Session
from tests.support import make_project
from tests.test_checkpoints import X, doubled_weights, infer, write_slowly

UNCHANGED = "unchanged: nothing to reload"


def run_session(tmp_path: Path, scenario: Any, **deadlines: float) -> Any:
    config = load_config(make_project(tmp_path))
    model = dataclasses.replace(config.models[0], deadlines=Deadlines(**deadlines))
    config = dataclasses.replace(config, models=(model,))

    async def main() -> Any:
        session = Session(config, endpoint=False, telemetry=False)
        seen: list[BaseEvent] = []
        session.events.subscribe(seen.append)
        try:
            await session.start()
            return await scenario(session, session.models[model.name], model, seen)
        finally:
            await session.stop()

    return asyncio.run(asyncio.wait_for(main(), 120))


def in_process(model: Any, weights: bytes) -> np.ndarray:
    """The example MLP with `weights`, called here on the test's input."""
    import importlib.util

    from safetensors.torch import load

    spec = importlib.util.spec_from_file_location("mlp_in_process", model.entry.file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build()
    net.load_state_dict(load(weights))
    with torch.no_grad():
        return net(torch.from_numpy(X)).numpy()


def unchanged_lines(seen: list[BaseEvent]) -> list[str]:
    return [e.unchanged for e in seen if isinstance(e, ReloadDone) and e.unchanged]


def test_reload_twice_and_a_save_without_a_change_build_nothing(tmp_path: Path) -> None:
    async def scenario(session: Session, sup: Any, model: Any, seen: list[BaseEvent]) -> None:
        pid, before = sup.worker.pid, await infer(sup)
        outcome = await session.reload_model(model.name, trigger="command")
        assert outcome.ok and outcome.unchanged and outcome.version == 1, outcome
        assert UNCHANGED in outcome.detail[-1] and "v1 serves" in outcome.detail[-1]
        assert "load" not in outcome.phases  # nothing was built
        # A save of the same bytes (new mtime, same content), and the same again.
        source = model.entry.file
        source.write_bytes(source.read_bytes())
        again = await session.reload_model(model.name, trigger="file", detail=[source.name])
        assert again.unchanged and again.version == 1, again
        assert sup.worker.pid == pid and sup.version == 1
        assert [o.unchanged for o in sup.history] == [True, True]
        assert len(unchanged_lines(seen)) == 2 and UNCHANGED in unchanged_lines(seen)[0]
        np.testing.assert_array_equal(await infer(sup), before)
        # --force builds the same files again; a real change builds too.
        forced = await session.reload_model(model.name, trigger="command", force=True)
        assert forced.ok and not forced.unchanged and forced.version == 2, forced
        source.write_text(source.read_text() + "\n# an edit\n")
        edited = await session.reload_model(model.name, trigger="file", detail=[source.name])
        assert edited.ok and not edited.unchanged and edited.version == 3, edited

    run_session(tmp_path, scenario)


def test_a_checkpoint_written_in_two_halves_reloads_once(tmp_path: Path) -> None:
    async def scenario(
        session: Session, sup: Any, model: Any, seen: list[BaseEvent]
    ) -> tuple[ReloadOutcome, ReloadOutcome]:
        weights = model.weights[0]
        new = doubled_weights(weights)
        shown = [weights.name]
        # The first half fires the watcher: its reload waits for the file to be complete.
        writer = write_slowly(weights, new, 1.0)
        first = asyncio.ensure_future(
            session.reload_model(model.name, trigger="file", detail=shown, weights_only=True)
        )
        await asyncio.to_thread(writer.join, 10)
        # The second half fires it again while the first reload runs: the follow-up.
        second = await session.reload_model(
            model.name, trigger="file", detail=shown, weights_only=True
        )
        done = await first
        assert done.ok and not done.unchanged and done.version == 2, done
        assert "checkpoint" in done.phases
        assert second.ok and second.unchanged and second.version == 2, second
        assert sup.version == 2 and len(unchanged_lines(seen)) == 1
        # What serves is the whole new checkpoint, as the model computes it in-process.
        np.testing.assert_allclose(await infer(sup), in_process(model, new), rtol=1e-4, atol=1e-5)
        return done, second

    run_session(tmp_path, scenario, checkpoint_s=30)

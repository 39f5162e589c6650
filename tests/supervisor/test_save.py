"""The save job on the fake worker (engine/model/save.py): the serving version's weights
asked of its worker with the version's digest, in the job order (never beside a reload's
swap), and a clear refusal when no version serves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hotreload.errors import BadRequestError
from hotreload.protocol.ops import WorkerOp
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, stepped


@stepped
async def test_save_asks_the_serving_worker_with_its_digest_after_the_running_reload(
    make: Make,
) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.hold(WorkerOp.SWAP)
    reloading = asyncio.ensure_future(sup.reload("file", force=True))
    await script.started(WorkerOp.SWAP)
    saving = asyncio.ensure_future(sup.save(Path("/tmp/out")))
    await asyncio.sleep(0.05)
    assert not script.saves  # queued behind the reload: v1 is not swapped out mid-save
    script.release(WorkerOp.SWAP)
    assert (await reloading).ok
    saved = await saving
    (request,) = script.saves
    assert (request.folder, request.model) == ("/tmp/out", sup.name)
    assert request.digest == sup.current.digest and saved["version"] == 2
    assert saved["files"] == ["model.safetensors", "hotreload.json"]


@stepped
async def test_save_with_no_version_serving_says_so(make: Make) -> None:
    script = Script()
    sup = make(script)
    script.fail_next[WorkerOp.LOAD] = {"message": "boom"}
    with pytest.raises(Exception, match="boom"):
        await sup.start()
    with pytest.raises(BadRequestError, match="no version serves to save; reload it first"):
        await sup.save(Path("/tmp/out"))
    assert not script.saves


@stepped
async def test_a_save_past_its_deadline_says_it_is_still_being_written(make: Make) -> None:
    """The worker cannot stop a save part way: past `deadlines.load_s` the reply says it is
    still being written and where to look, and a second save waits for the first to end."""
    from hotreload.config.models import Deadlines

    script = Script()
    sup = make(script, deadlines=Deadlines(load_s=0.2))
    await sup.start()
    script.hold(WorkerOp.SAVE)
    with pytest.raises(BadRequestError, match=r"still being written by the worker; check /tmp/out"):
        await asyncio.wait_for(sup.save(Path("/tmp/out")), 5)
    with pytest.raises(BadRequestError, match=r"the save into /tmp/out is still being written"):
        await asyncio.wait_for(sup.save(Path("/tmp/other")), 5)
    script.release(WorkerOp.SAVE)
    for _ in range(200):
        try:
            saved = await asyncio.wait_for(sup.save(Path("/tmp/other")), 5)
            break
        except BadRequestError:
            await asyncio.sleep(0.01)
    assert saved["folder"] == "/tmp/other"
    assert [r.folder for r in script.saves] == ["/tmp/out", "/tmp/other"]  # one at a time


@stepped
async def test_a_save_into_a_folder_with_files_is_refused_unless_forced(make: Make) -> None:
    import tempfile

    script = Script()
    sup = make(script)
    await sup.start()
    with tempfile.TemporaryDirectory() as tmp:
        await _refused_unless_forced(sup, script, Path(tmp))


async def _refused_unless_forced(sup: Any, script: Script, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(BadRequestError, match=r"is not empty .* pass --force to write into it"):
        await sup.save(tmp_path)
    assert not script.saves
    await sup.save(tmp_path / "new")  # a folder not there yet: no question
    saved = await sup.save(tmp_path, force=True)
    assert saved["folder"] == str(tmp_path)
    assert [r.folder for r in script.saves] == [str(tmp_path / "new"), str(tmp_path)]

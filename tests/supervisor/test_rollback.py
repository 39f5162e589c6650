"""Rollback on the fake worker (engine/model/rollback.py, kept_versions.py): a kept version's
code, weights and pushes built again under a new version number, the history saying
"rollback to vN", what is kept and let go (`keep_versions`), and the errors that say what
to name instead."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hotreload.commands.printer import format_event
from hotreload.config import load_config
from hotreload.engine.event_kinds import ReloadDone, ReloadRequested
from hotreload.engine.events import EventBus
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import ModelSupervisor
from hotreload.errors import BadRequestError
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.shared_state import pack_state
from tests.supervisor.fake_worker import FakeWorker, Script
from tests.support import make_project

Make = Callable[..., ModelSupervisor]


def with_snapshots(body: Callable[[Make, Path], Awaitable[None]]) -> Callable[[Path], None]:
    """Run `body(make, model_file)` bounded, over fake workers, with snapshots taken (a
    rollback builds from them); every supervisor made is stopped afterwards."""

    def test(tmp_path: Path) -> None:
        config = load_config(make_project(tmp_path))
        model_file = config.root / "model.py"

        async def main() -> None:
            made: list[ModelSupervisor] = []

            def build(script: Script, **changes: object) -> ModelSupervisor:
                model = dataclasses.replace(config.models[0], device="cpu", **changes)
                events = EventBus(None)
                sup = ModelSupervisor(
                    model,
                    config,
                    events,
                    DeviceLocks(tmp_path / "locks"),
                    snapshot_dir=tmp_path / "snapshots",
                    spawn=lambda generation, code, standby: FakeWorker(script, generation),
                )
                sup.seen = []  # type: ignore[attr-defined]
                events.subscribe(sup.seen.append)  # type: ignore[attr-defined]
                made.append(sup)
                return sup

            try:
                await asyncio.wait_for(body(build, model_file), 60)
            finally:
                for sup in made:
                    await asyncio.wait_for(sup.stop(drain_timeout_s=0.1), 10)

        asyncio.run(main())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


def edit(model_file: Path, line: str) -> None:
    model_file.write_text(model_file.read_text() + f"\n# {line}\n")


def copy_of(load_code: dict, live: Path) -> Path:
    """The copy a LOAD's code compiles `live` (a file in the project's root) from: its
    `sources` (live root -> copy) for a reload; a rollback's code is all in the snapshot."""
    if "sources" not in load_code:  # every path remapped (kept_versions.rollback_code)
        return Path(load_code["root"]) / live.name
    for root, copy in load_code["sources"]:
        if live.is_relative_to(root):
            return Path(copy) / live.relative_to(root)
    raise AssertionError(f"{live} is in no source root of {load_code['sources']}")


@with_snapshots
async def test_a_rollback_builds_the_kept_code_as_the_next_version(
    make: Make, model_file: Path
) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    v1_text = model_file.read_text()
    edit(model_file, "v2")
    assert (await sup.reload("file")).ok and sup.version == 2
    outcome = await sup.rollback()  # the previous one: v1
    assert outcome.ok, outcome
    assert (outcome.version, outcome.trigger, outcome.detail[:1]) == (3, "rollback", ["to v1"])
    assert sup.version == 3 and sup.history[-1] is outcome
    seen = sup.seen  # type: ignore[attr-defined]
    asked = [e for e in seen if isinstance(e, ReloadRequested)][-1]
    assert format_event(asked) == "mlp: reload requested by rollback (to v1)"
    done = [e for e in seen if isinstance(e, ReloadDone)][-1]
    assert done.rollback_of == 1
    assert (format_event(done) or "").startswith("mlp: rollback to v1 -> v3 ok in ")
    load = script.loads[-1]
    assert load.version == 3 and load.reimport
    # The v1 code, not the edit on disk: compiled from v1's copy.
    assert copy_of(load.code, model_file).read_text() == v1_text != model_file.read_text()
    # The weights files unchanged and no push on either: the serving tensors are shared.
    assert load.reuse and load.overlays == []
    kept = sup.record.kept
    assert [k.version for k in kept] == [1, 2, 3]
    assert kept[-1].rollback_of == 1 and kept[-1].snapshot.folder == kept[0].snapshot.folder
    assert sup.record.good_snapshot is kept[0].snapshot  # a restart comes back on v1's code
    again = await sup.rollback(2)
    assert again.ok and sup.version == 4 and again.detail[:1] == ["to v2"]
    assert "# v2" in copy_of(script.loads[-1].code, model_file).read_text()


@with_snapshots
async def test_keep_versions_bounds_what_is_kept_and_names_it_in_the_errors(
    make: Make, model_file: Path
) -> None:
    sup = make(Script(), keep_versions=2)
    await sup.start()
    with pytest.raises(BadRequestError, match="no earlier version is kept"):
        await sup.rollback()
    v1_folder = sup.record.kept[0].snapshot.folder
    for n in (2, 3):
        edit(model_file, f"v{n}")
        assert (await sup.reload("file")).ok
    assert [k.version for k in sup.record.kept] == [2, 3]
    assert not v1_folder.exists()  # dropped: its copy is gone
    with pytest.raises(BadRequestError, match=r"v1 is not kept \(kept: v2, v3\)"):
        await sup.rollback(1)
    with pytest.raises(BadRequestError, match="v3 is the version serving now"):
        await sup.rollback(3)
    assert sup.version == 3 and len(sup.history) == 2  # refused before any history row


@with_snapshots
async def test_a_failed_rollback_leaves_the_serving_version_serving(
    make: Make, model_file: Path
) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    edit(model_file, "v2")
    assert (await sup.reload("file")).ok
    script.fail_next[WorkerOp.LOAD] = {"message": "boom in build()"}
    failed = await sup.rollback(1)
    assert not failed.ok and failed.phase == "load" and "boom" in (failed.error or "")
    assert sup.version == 2 and sup.state == "serving"
    assert failed.trigger == "rollback" and failed.detail[:1] == ["to v1"]
    assert [k.version for k in sup.record.kept] == [1, 2]  # a failed one is not kept
    # As after a failed reload, the number no version served goes to the next build.
    assert (await sup.rollback(1)).ok and sup.version == 3


@with_snapshots
async def test_a_rollback_lays_the_kept_versions_pushes_again(make: Make, model_file: Path) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    packed = pack_state({"w": np.ones(4, np.float32)}, cuda_ipc=False)
    try:
        pushed = await sup.push(packed.descriptor)
    finally:
        packed.close()
    assert pushed["version"] == 2
    overlay = sup.record.overlays[0]
    back = await sup.rollback(1)
    assert back.ok and sup.version == 3
    load = script.loads[-1]
    # The serving tensors hold the push, v1 does not: nothing shared, no push laid.
    assert not load.reuse and load.overlays == []
    # Kept with v2, served by none: on disk, its memory let go.
    spilled = sup.record.kept[0].snapshot.folder.parent / "pushes" / f"push-{overlay.id}.bin"
    for _ in range(500):  # after the rollback's answer, before the next job
        if overlay.fd is None:
            break
        await asyncio.sleep(0.01)
    assert sup.record.overlays == [] and overlay.fd is None
    assert spilled.read_bytes() == np.ones(4, np.float32).tobytes()
    forward = await sup.rollback(2)
    assert forward.ok and sup.version == 4
    load = script.loads[-1]
    assert [o["id"] for o in load.overlays] == [overlay.id] and not load.reuse
    (again,) = sup.record.overlays  # a sealed memfd made from the copy: the same bytes
    assert again.id == overlay.id and again.fd is not None
    assert os.pread(again.fd, 16, 0) == spilled.read_bytes()
    assert load.overlays[0]["state"]["path"] == f"/proc/{os.getpid()}/fd/{again.fd}"
    for n in (5, 6, 7):  # edits over the same files keep the push: so do their versions
        edit(model_file, f"v{n}")
        assert (await sup.reload("file")).ok
    kept = sup.record.kept
    assert [k.version for k in kept] == [5, 6, 7]
    assert all([o.id for o in k.overlays] == [overlay.id] for k in kept) and spilled.exists()


def test_a_pushes_copy_goes_with_the_last_kept_version_that_held_it(tmp_path: Path) -> None:
    from hotreload.engine.model.kept_versions import KeptVersion, unused_spills
    from hotreload.engine.model.pushes import Overlay
    from hotreload.engine.snapshots import Snapshot

    snap = Snapshot(1, tmp_path / "mlp" / "v1", (), ())
    one, two = Overlay(1, {}, True), Overlay(2, {}, True)

    def kept(version: int, *overlays: Overlay) -> KeptVersion:
        return KeptVersion(version, snap, overlays, None, None, "push")

    dropped = [kept(2, one), kept(3, one, two)]
    pushes = tmp_path / "mlp" / "pushes"
    assert unused_spills(dropped, [kept(4, two)]) == [pushes / "push-1.bin"]
    assert unused_spills(dropped, [kept(4, one, two)]) == []


@with_snapshots
async def test_a_rollback_across_a_settings_change_is_refused_naming_the_keys(
    make: Make, model_file: Path
) -> None:
    """v1 was built with other `weights` (and `env`) than serve now: building it again
    would load today's file under the name "rollback to v1", so the rollback refuses, names
    what changed, and builds nothing; with the settings put back it rolls back again."""
    from hotreload.engine.model import settings_change

    script = Script()
    sup = make(script)
    await sup.start()
    first = sup.model
    w_new = model_file.parent.parent / "ext" / "step2000.safetensors"
    w_new.parent.mkdir()
    w_new.write_bytes(Path(first.weights[0]).read_bytes())
    changed = dataclasses.replace(first, weights=(w_new,), env={**first.env, "K": "1"})
    assert (await sup.reload("config", settings=settings_change.Settings(changed, sup.ignore))).ok
    assert sup.version == 2 and sup.model is changed
    loads = len(script.loads)
    with pytest.raises(BadRequestError, match=r"cannot roll back to v1: .*weights, env changed"):
        await sup.rollback(1)
    assert len(script.loads) == loads and sup.version == 2
    # A live setting changed too (read each time it is used): it does not stand in the way.
    back = dataclasses.replace(first, max_queue_size=first.max_queue_size + 1)
    assert (await sup.reload("config", settings=settings_change.Settings(back, sup.ignore))).ok
    out = await sup.rollback(1)
    assert out.ok, out.error
    assert script.loads[-1].code["weights"] != [str(w_new)]


def _memfd_overlay(data: bytes, id_: int = 1) -> Any:
    from hotreload.engine.model.pushes import Overlay

    fd = os.memfd_create("test-push", os.MFD_CLOEXEC)
    os.write(fd, data)
    return Overlay(id_, {}, True, fd)


def test_a_spill_that_fails_part_way_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hotreload.engine.model import kept_versions

    overlay = _memfd_overlay(b"x" * 4096)

    def half(src: int, dst: int, size: int) -> None:
        os.write(dst, b"x" * (size // 2))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kept_versions, "_copy", half)
    try:
        with pytest.raises(OSError, match="No space left"):
            kept_versions.spill(overlay, tmp_path / "pushes", headroom=0)
        assert list((tmp_path / "pushes").iterdir()) == []
        assert overlay.fd is not None  # not copied: its memory stays
    finally:
        overlay.close()


def test_a_spill_with_too_little_free_disk_writes_nothing_and_says_so(tmp_path: Path) -> None:
    from hotreload.engine.model import kept_versions

    overlay = _memfd_overlay(b"x" * 4096)
    try:
        free = __import__("shutil").disk_usage(tmp_path).free
        with pytest.raises(kept_versions.NoRoom, match=r"MiB to copy, \d+ MiB free on the disk"):
            kept_versions.spill(overlay, tmp_path / "pushes", headroom=free)
        assert list((tmp_path / "pushes").iterdir()) == []
    finally:
        overlay.close()


@with_snapshots
async def test_with_too_little_disk_the_kept_versions_holding_a_push_are_dropped(
    make: Make, model_file: Path
) -> None:
    """A push no version serves any more, and no room for its copy: the kept versions that
    hold it go (said so), and its memory with them, rather than filling disk or memory."""
    from hotreload.engine.event_kinds import ModelNote
    from hotreload.engine.model import kept_versions

    script = Script()
    sup = make(script)
    await sup.start()
    packed = pack_state({"w": np.ones(4, np.float32)}, cuda_ipc=False)
    try:
        await sup.push(packed.descriptor)
    finally:
        packed.close()
    overlay = sup.record.overlays[0]
    real = kept_versions.spill
    kept_versions.spill = lambda o, folder: real(o, folder, headroom=1 << 62)  # type: ignore[assignment]
    try:
        assert (await sup.rollback(1)).ok  # v3 = v1: the push (v2's) serves no more
        await sup.st.spilled()
    finally:
        kept_versions.spill = real  # type: ignore[assignment]
    assert [k.version for k in sup.record.kept] == [1, 3] and overlay.fd is None
    notes = [e.message for e in sup.seen if isinstance(e, ModelNote)]  # type: ignore[attr-defined]
    assert any("v2 no longer kept for a rollback" in n and "free disk space" in n for n in notes)
    assert not (sup.record.kept[0].snapshot.folder.parent / "pushes").exists() or not list(
        (sup.record.kept[0].snapshot.folder.parent / "pushes").iterdir()
    )
    with pytest.raises(BadRequestError, match="v2 is not kept"):
        await sup.rollback(2)


def test_restoring_pushes_that_fails_part_way_closes_the_memfds_it_made(tmp_path: Path) -> None:
    from hotreload.engine.model import kept_versions, pushes

    folder = tmp_path / "pushes"
    first, second = _memfd_overlay(b"a" * 64, 1), _memfd_overlay(b"b" * 64, 2)
    kept_versions.spill(first, folder, headroom=0)  # on disk: its memory let go
    second.close()  # neither in memory nor on disk: its restore fails
    assert first.fd is None and second.fd is None

    def memfds() -> set[str]:  # the memfds `restored` makes, by their name
        out = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                if "hotreload-state-" in os.readlink(f"/proc/self/fd/{fd}"):
                    out.add(fd)
            except OSError:
                pass  # the listing's own fd, closed by now
        return out

    before = memfds()
    with pytest.raises(OSError):
        kept_versions.restored_all((first, second), folder)
    pushes._CLOSER.submit(lambda: None).result(timeout=10)  # Overlay.close closes on it
    assert memfds() <= before  # the memfd made for #1 is closed


def test_an_edit_saved_after_a_rollback_was_asked_for_runs_after_it() -> None:
    """Queued: a reload, then a rollback. A later edit does not merge into that reload
    (which would run it before the rollback, and the rollback would undo it): it queues
    after the rollback; a second edit merges into that one."""
    from hotreload.engine.model.jobs import JobQueue, ReloadJob
    from hotreload.engine.model.rollback import RollbackJob

    async def main() -> None:
        q = JobQueue()
        first = q.add(ReloadJob(trigger="file", detail=["model.py"]))
        back = q.add(RollbackJob(version=1))
        edit = q.add(ReloadJob(trigger="file", detail=["layers.py"]))
        assert edit is not first and list(q) == [first, back, edit]
        again = q.add(ReloadJob(trigger="file", detail=["model.py"]))
        assert again is edit and edit.detail == ["layers.py", "model.py"]
        assert first.detail == ["model.py"]

    asyncio.run(main())


def test_the_report_names_the_version_a_rollback_served_again(tmp_path: Path) -> None:
    import json
    import time

    from hotreload.commands.report import waterfall
    from hotreload.commands.report_log import read_log
    from hotreload.engine.events import as_dict

    done = ReloadDone(
        model="mlp", version=4, total_s=0.1, policy="availability", strategy="inplace",
        phases={}, trigger="rollback", rollback_of=1,
    )  # fmt: skip
    row = {**as_dict(done), "ts": time.time()}
    assert row["rollback_of"] == 1
    (tmp_path / "events.jsonl").write_text(json.dumps(row) + "\n")
    (reload,) = read_log(tmp_path).reloads
    assert reload.rollback_of == 1
    assert "rollback to v1: v4 ok" in waterfall([reload])

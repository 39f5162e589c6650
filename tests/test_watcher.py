"""The file watcher in-process, on real files, with small windows (no worker needed)."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import time
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.engine import watcher as watcher_mod
from hotreload.engine.event_kinds import BaseEvent, WatchError, Watching, WatchResumed, WatchWaiting
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.watcher import Change, FileWatcher
from tests.support import make_project


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 60))


async def watching(config: Path, actions, *, settle: float = 1.5, poll: bool | None = None):  # type: ignore[no-untyped-def]
    """Start a watcher, run `actions` (a sync function) in a thread, collect changes."""
    cfg = load_config(config)
    events = EventBus(None)
    seen_events: list[BaseEvent] = []
    events.subscribe(seen_events.append)
    changes: list[Change] = []

    async def on_change(change: Change) -> None:
        changes.append(change)

    w = FileWatcher(
        cfg,
        on_change,
        events,
        rules_for=lambda m: IgnoreRules(m.ignore, extra_dirs=[cfg.state_dir]),
        quiet_s=0.08,
        max_wait_s=0.6,
        poll=poll,
    )
    await w.start()
    try:
        await asyncio.to_thread(actions)
        await asyncio.sleep(settle)
    finally:
        await w.stop()
    return changes, seen_events


def test_edit_is_one_change_and_weights_are_weights_only(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model, weights = config.parent / "model.py", config.parent / "weights.safetensors"

    def edit_code() -> None:
        model.write_text(model.read_text() + "\n# edited\n")

    changes, _ = run(watching(config, edit_code))
    assert [(c.model, [p.name for p in c.paths], c.weights_only) for c in changes] == [
        ("mlp", ["model.py"], False)
    ]

    def edit_weights() -> None:
        weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")

    changes, _ = run(watching(config, edit_weights))
    assert [(c.model, c.weights_only) for c in changes] == [("mlp", True)]


def test_touch_same_bytes_and_ignored_files_change_nothing(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    root = config.parent

    def noise() -> None:
        (root / "model.py").touch()
        (root / "model.py").write_text((root / "model.py").read_text())
        for name in ("x.swp", "model.py~", ".#model.py", "4913", "run.log", "a___jb_tmp___"):
            (root / name).write_text("noise")
        (root / "__pycache__").mkdir(exist_ok=True)
        (root / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
        (root / ".hotreload").mkdir(exist_ok=True)
        (root / ".hotreload" / "events.jsonl").write_text("{}\n")

    changes, _ = run(watching(config, noise))
    assert changes == []


def test_burst_coalesces_by_quiet_and_max_window(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"

    saved: list[float] = []

    def burst() -> None:
        # 40 saves, 25 ms apart: never 80 ms of quiet, so the 600 ms cap flushes.
        for i in range(40):
            model.write_text(model.read_text() + f"\n# save {i}\n")
            saved.append(time.monotonic())
            time.sleep(0.025)

    changes, _ = run(watching(config, burst, settle=0.8))
    # About 1 s of saves: 2 or 3 flushes by the cap. A stall of this machine between two
    # saves (a gap past the 80 ms of quiet) rightly flushes once more each: allowed for.
    stalls = sum(1 for a, b in itertools.pairwise(saved) if b - a > 0.08)
    cap = int((saved[-1] - saved[0]) / 0.6) + 2
    assert 1 <= len(changes) <= cap + stalls, (changes, cap, stalls)
    assert len(changes) < 10, "saves 25 ms apart coalesce"


def test_configured_ignore_globs(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    config.write_text(
        config.read_text().replace(
            'strategy = "inplace"', 'strategy = "inplace"\nignore = ["data/**"]'
        )
    )
    (config.parent / "data").mkdir()

    def write_data() -> None:
        (config.parent / "data" / "batch.npy").write_bytes(b"\0" * 100)
        (config.parent / "helper.py").write_text("X = 1\n")

    changes, _ = run(watching(config, write_data))
    assert [p.name for c in changes for p in c.paths] == ["helper.py"]


def test_folder_moved_out_of_the_tree_changes_its_files(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    pkg = config.parent / "layers"
    pkg.mkdir()
    (pkg / "block.py").write_text("X = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()

    def move_out() -> None:
        # inotify reports the folder alone: no event names block.py.
        pkg.rename(outside / "layers")

    # watchdog holds an unpaired IN_MOVED_FROM a moment, waiting for its IN_MOVED_TO.
    changes, _ = run(watching(config, move_out, settle=3.0))
    assert [(c.model, [p.name for p in c.paths]) for c in changes] == [("mlp", ["block.py"])]


def test_inotify_limit_falls_back_to_polling_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class LimitedObserver(watcher_mod.Observer):  # type: ignore[misc,valid-type]
        """The native notifier, scripted to fail as a machine at its inotify limit does."""

        def schedule(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(watcher_mod, "Observer", LimitedObserver)
    config = make_project(tmp_path)
    assert config.read_text().rstrip().endswith("max_wait_ms = 1500"), "[watch] comes last"
    config.write_text(config.read_text() + "poll_interval_ms = 50\n")
    model = config.parent / "model.py"

    def edit() -> None:
        time.sleep(0.2)
        model.write_text(model.read_text() + "\n# polled\n")

    changes, events = run(watching(config, edit, settle=1.0))
    errors = [e.error for e in events if isinstance(e, WatchError)]
    assert errors and "fs.inotify.max_user_watches" in errors[0] and "polling" in errors[0]
    assert [e.mode for e in events if isinstance(e, Watching)] == ["polling"]
    assert [p.name for c in changes for p in c.paths] == ["model.py"]


def test_unreadable_folder_is_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_project(tmp_path)
    secret = tmp_path / "secret"  # outside the project folder: a root of its own
    secret.mkdir()
    config.write_text(
        config.read_text().replace(
            'strategy = "inplace"', 'strategy = "inplace"\nwatch = [".", "../secret"]'
        )
    )
    real_access = os.access
    # Root reads everything, so this one check is scripted; the rest is the real file system.
    monkeypatch.setattr(
        watcher_mod.os,
        "access",
        lambda p, mode: False if Path(p) == secret.resolve() else real_access(p, mode),
    )
    _, events = run(watching(config, lambda: None, settle=0.1))
    errors = [e.error for e in events if isinstance(e, WatchError)]
    assert any("cannot read folder" in e and "secret" in e and "permissions" in e for e in errors)
    (watching_event,) = [e for e in events if isinstance(e, Watching)]
    assert str(config.parent.resolve()) in watching_event.paths


async def _watcher(config: Path) -> tuple[FileWatcher, list[Change], list[BaseEvent]]:
    cfg = load_config(config)
    events = EventBus(None)
    seen: list[BaseEvent] = []
    events.subscribe(seen.append)
    changes: list[Change] = []

    async def on_change(change: Change) -> None:
        changes.append(change)

    w = FileWatcher(
        cfg,
        on_change,
        events,
        rules_for=lambda m: IgnoreRules(m.ignore, extra_dirs=[cfg.state_dir]),
        quiet_s=0.05,
        max_wait_s=0.5,
    )
    return w, changes, seen


async def _until(predicate, what: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_an_edit_saved_while_the_models_load_is_reloaded_at_watch_start(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"

    async def main() -> list[Change]:
        w, changes, _ = await _watcher(config)
        await w.prime()  # what the models are about to load
        # ... the load takes seconds; the user saves meanwhile, before any watch exists ...
        model.write_text(model.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
        await w.start()
        try:
            await _until(lambda: changes, "the edit saved during the load")
        finally:
            await w.stop()
        return changes

    changes = run(main())
    assert [(c.model, [p.name for p in c.paths]) for c in changes] == [("mlp", ["model.py"])]


def test_nothing_saved_during_the_load_reloads_nothing(tmp_path: Path) -> None:
    config = make_project(tmp_path)

    async def main() -> tuple[list[Change], int]:
        w, changes, _ = await _watcher(config)
        await w.prime()
        await w.start()
        try:
            await _until(lambda: w.flushes == 1, "the start-up comparison")
        finally:
            await w.stop()
        return changes, w.flushes

    assert run(main()) == ([], 1)


def test_pause_edit_resume_applies_the_edit_and_counts_it_while_paused(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"

    async def main() -> tuple[list[Change], list[BaseEvent], int]:
        w, changes, seen = await _watcher(config)
        await w.start()
        try:
            w.pause()
            model.write_text(model.read_text().replace("SCALE = 1.0", "SCALE = 3.0"))
            await _until(lambda: len(w.waiting) == 1, "1 change waiting")
            (config.parent / "notes.txt~").write_text("editor backup: ignored")
            await asyncio.sleep(0.3)  # would a reload start while paused? (none may)
            assert changes == [] and len(w.waiting) == 1
            await w.resume()
            await _until(lambda: changes, "the edit made while paused")
            return changes, seen, len(w.waiting)
        finally:
            await w.stop()

    changes, seen, waiting_after = run(main())
    assert [(c.model, [p.name for p in c.paths]) for c in changes] == [("mlp", ["model.py"])]
    assert waiting_after == 0
    assert [e.waiting for e in seen if isinstance(e, WatchWaiting)] == [1]
    (resumed,) = [e for e in seen if isinstance(e, WatchResumed)]
    assert resumed.waiting == 1


def test_an_edit_undone_while_paused_waits_no_more(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    original = model.read_text()

    async def main() -> tuple[list[Change], int]:
        w, changes, _ = await _watcher(config)
        await w.start()
        try:
            w.pause()
            model.write_text(original + "\n# tried something\n")
            await _until(lambda: len(w.waiting) == 1, "1 change waiting")
            model.write_text(original)
            await _until(lambda: not w.waiting, "no change waiting")
            await w.resume()
            await _until(lambda: w.flushes >= 1, "the resume comparison")
            return changes, len(w.waiting)
        finally:
            await w.stop()

    assert run(main()) == ([], 0)


def test_a_large_checkpoint_is_compared_by_its_stat_not_hashed(tmp_path: Path) -> None:
    """Hashing a 1 GiB checkpoint on every save cost ~0.5 s per reload: big files are
    compared by inode, size and times; small ones keep the content hash (a touch of a
    small file still reloads nothing)."""
    import os

    from hotreload.engine.watcher import HASH_BELOW_BYTES, _fingerprint

    big = tmp_path / "w.safetensors"
    with open(big, "wb") as f:
        f.truncate(HASH_BELOW_BYTES)
    first = _fingerprint(big)
    assert first is not None and first.digest.startswith("stat:")
    st = big.stat()
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _fingerprint(big) != first
    small = tmp_path / "model.py"
    small.write_text("x = 1\n")
    a = _fingerprint(small)
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    b = _fingerprint(small)
    assert a is not None and b is not None and a.digest == b.digest


@pytest.mark.parametrize("rebuilt", [True, False], ids=["config-rebuilt-it", "settings-only"])
def test_a_weights_file_saved_with_the_config_edit_naming_it_builds_once(
    tmp_path: Path, rebuilt: bool
) -> None:
    """A new weights file and the config edit that names it, in one flush: where the edit
    built the model anew (it read the new file) the file reloads nothing more; where the
    edit built nothing, the file, now used, reloads the model."""
    config = make_project(tmp_path)

    async def main() -> tuple[list[Change], int]:
        w, changes, _ = await _watcher(config)
        edits = 0

        async def on_config_change() -> frozenset[str]:
            nonlocal edits
            edits += 1
            await w.use_config(load_config(config))  # as the session does once it serves
            return frozenset({"mlp"}) if rebuilt else frozenset()

        w.on_config_change = on_config_change
        await w.prime()
        new_weights = w.config.path.parent / "weights2.safetensors"
        new_weights.write_bytes((config.parent / "weights.safetensors").read_bytes())
        config.write_text(
            config.read_text().replace('"weights.safetensors"', '"weights2.safetensors"')
        )
        await w._dispatch({new_weights, w.config.path})  # the two saves' one flush
        return changes, edits

    changes, edits = run(main())
    assert edits == 1
    got = [(c.model, [p.name for p in c.paths]) for c in changes]
    assert got == ([] if rebuilt else [("mlp", ["weights2.safetensors"])]), got

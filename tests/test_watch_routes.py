"""Which models a saved file reloads, in-process on real files (engine/watch_routes.py). The
end-to-end tests with worker processes are in tests/test_watch_uses.py; here the used files
come from the seam the session fills them from (`uses`), so the rules are quick to step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hotreload.config import ModelConfig, load_config
from hotreload.engine.event_kinds import BaseEvent, FileUnused
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.used_files import tried_imports
from hotreload.engine.watcher import Change, FileWatcher
from hotreload.engine.worker_port import WorkerReplyError
from tests.test_watcher import _until, run

TWO = """
[[models]]
name = "a"
entry = "a.py:build"
example = "a.py:example_input"
weights = ["w.safetensors"]

[[models]]
name = "b"
entry = "b.py:build"
example = "b.py:example_input"
{extra_b}
"""


def project(tmp_path: Path, extra_b: str = "") -> Path:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    for name in ("a.py", "b.py", "helper.py", "client.py", "data/labels.txt"):
        (proj / name).write_text("# v1\n")
    (proj / "w.safetensors").write_bytes(b"w1")
    config = proj / "hotreload.toml"
    config.write_text(TWO.format(extra_b=extra_b))
    return config


async def _watch(config: Path, used: dict[str, set[str] | None], slow: set[str] | None = None):  # type: ignore[no-untyped-def]
    cfg = load_config(config)
    events = EventBus(None)
    seen: list[BaseEvent] = []
    events.subscribe(seen.append)
    changes: list[Change] = []
    gate = asyncio.Event()

    async def on_change(change: Change) -> None:
        changes.append(change)
        if slow and change.model in slow:
            await gate.wait()

    def uses(m: ModelConfig) -> frozenset[Path] | None:
        names = used[m.name]
        return None if names is None else frozenset(config.parent / n for n in names)

    w = FileWatcher(
        cfg,
        on_change,
        events,
        rules_for=lambda m: IgnoreRules(m.ignore, extra_dirs=[cfg.state_dir]),
        quiet_s=0.05,
        max_wait_s=0.3,
        uses=uses,
    )
    await w.start()
    return w, changes, seen, gate


def routed(changes: list[Change]) -> list[tuple[str, list[str], bool]]:
    return sorted((c.model, sorted(p.name for p in c.paths), c.weights_only) for c in changes)


def test_a_save_reloads_the_models_that_use_the_file(tmp_path: Path) -> None:
    config = project(tmp_path, extra_b='watch = ["data"]')
    proj = config.parent
    used: dict[str, set[str] | None] = {"a": {"helper.py"}, "b": set()}

    async def main():  # type: ignore[no-untyped-def]
        w, changes, seen, _ = await _watch(config, used)
        try:
            steps = []
            for name in ("a.py", "helper.py", "w.safetensors", "data/labels.txt", "client.py"):
                n = len(changes)
                (proj / name).write_text(f"# {name} edited\n")
                if name != "client.py":
                    await _until(lambda n=n: len(changes) > n, name)
                else:
                    await _until(lambda: any(isinstance(e, FileUnused) for e in seen), name)
                await asyncio.sleep(0.15)  # one flush each
                steps.append(routed(changes[n:]))
            (proj / "client.py").write_text("# saved again\n")
            used["a"] = None  # no version loaded: every file in its folder reloads it
            (proj / "notes.md").write_text("new\n")
            await _until(lambda: any(p.name == "notes.md" for c in changes for p in c.paths), "x")
            await asyncio.sleep(0.2)
        finally:
            await w.stop()
        return steps, changes, seen

    steps, changes, seen = run(main())
    assert steps == [
        [("a", ["a.py"], False)],  # its entry: itself only
        [("a", ["helper.py"], False)],  # b does not import it
        [("a", ["w.safetensors"], True)],  # declared: a weights reload
        [("b", ["labels.txt"], False)],  # b lists data/ in `watch`: everything there
        [],  # nobody imports the client script
    ]
    unused = [e.path for e in seen if isinstance(e, FileUnused)]
    assert unused == [str(proj / "client.py")], "once per file, not once per save"
    assert [c.model for c in changes if any(p.name == "notes.md" for p in c.paths)] == ["a"]


def test_a_file_a_running_reload_starts_to_use_reloads_again_and_is_not_unused(
    tmp_path: Path,
) -> None:
    config = project(tmp_path)
    proj = config.parent
    used: dict[str, set[str] | None] = {"a": set(), "b": set()}

    async def main():  # type: ignore[no-untyped-def]
        w, changes, seen, gate = await _watch(config, used, slow={"a"})
        try:
            (proj / "a.py").write_text("import extra\n")
            await _until(lambda: changes, "a's reload")
            # While a's reload runs (it may have read extra.py already), extra.py is saved;
            # the reload's new version imports it.
            (proj / "extra.py").write_text("E = 2\n")
            await asyncio.sleep(0.3)
            used["a"] = {"extra.py"}
            gate.set()
            await _until(lambda: len(changes) >= 2, "the follow-up")
            await asyncio.sleep(0.1)
        finally:
            await w.stop()
        return changes, seen

    changes, seen = run(main())
    assert routed(changes) == [("a", ["a.py"], False), ("a", ["extra.py"], False)]
    assert not [e for e in seen if isinstance(e, FileUnused)]


def test_a_failed_build_names_the_files_it_tried_through_every_wrapper() -> None:
    reply = WorkerReplyError({"message": "SyntaxError", "imports": ["/p/m.py", "/p/bad.py"]})
    try:
        try:
            raise reply
        except WorkerReplyError as exc:
            raise RuntimeError("load failed") from exc
    except RuntimeError as wrapped:
        assert tried_imports(wrapped) == ("/p/m.py", "/p/bad.py")
    assert tried_imports(RuntimeError("no worker reply")) == ()


def test_a_worker_restarted_on_the_snapshot_names_the_live_files(tmp_path: Path) -> None:
    """After a restart the worker imported the last good snapshot's copies: they stand for
    the live files, which are the ones saved."""
    from types import SimpleNamespace

    from hotreload.engine.model.record import VersionInfo
    from hotreload.engine.used_files import files_used

    config = project(tmp_path)
    proj = config.parent.resolve()
    a = load_config(config).models[0]
    copy = tmp_path / "snap" / "v3" / "r0"
    snapshot = SimpleNamespace(roots=((proj, copy),))
    record = SimpleNamespace(
        current=VersionInfo(version=3, imports=(str(copy / "helper.py"),)),
        tried_imports=(str(proj / "broken.py"),),
        good_snapshot=snapshot,
    )
    used = files_used(a, record)  # type: ignore[arg-type]
    assert used is not None
    assert {proj / "helper.py", proj / "broken.py", proj / "a.py"} <= used
    assert proj / "config.json" in used  # beside its weights: the model's own config
    assert not any(copy in p.parents for p in used)
    record.current = None  # no version: no list, the folder rule
    assert files_used(a, record) is None  # type: ignore[arg-type]


def test_the_worker_names_project_modules_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a LOAD reply lists: modules imported from the code folders, and the file a failed
    import tried to compile; never an installed package in the project (its .venv) nor the
    standard library."""
    import importlib
    import sys

    from hotreload.worker import imported_files
    from hotreload.worker.fresh_source import compile_from_source

    proj = tmp_path / "proj"
    site = proj / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (proj / "uses_helper_x.py").write_text("import json\nimport installed_x\n")
    (proj / "broken_x.py").write_text("B = (\n")
    (site / "installed_x.py").write_text("I = 1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(proj))
    for name in ("uses_helper_x", "installed_x", "broken_x"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    compile_from_source([proj])
    with imported_files.tracking([proj]):
        importlib.import_module("uses_helper_x")
    assert imported_files.imported_files([proj]) == [str(proj / "uses_helper_x.py")]
    with pytest.raises(SyntaxError) as info, imported_files.tracking([proj]):
        importlib.import_module("broken_x")
    tried = imported_files.failure_fields(info.value)["imports"]
    assert str(proj / "broken_x.py") in tried and str(site / "installed_x.py") not in tried
    for name in ("uses_helper_x", "installed_x"):
        sys.modules.pop(name, None)
    compile_from_source([])

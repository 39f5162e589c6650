"""A watched folder deleted and re-created is watched again, and the user is told in
between (issue 30, item 6). Before, one reload happened and then every edit was ignored."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from hotreload.engine.event_kinds import WatchError, Watching
from tests.support import make_project
from tests.test_watcher import run, watching


def test_a_deleted_and_recreated_folder_is_watched_again(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    src = config.parent / "src"
    src.mkdir()
    for name in ("model.py", "weights.safetensors"):
        (config.parent / name).rename(src / name)
    (src / "helper.py").write_text("A = 1\n")
    text = config.read_text().replace('"model.py:', '"src/model.py:')
    text = text.replace('["weights.safetensors"]', '["src/weights.safetensors"]')
    config.write_text(text.replace('strategy = "inplace"', 'strategy = "inplace"\nwatch = ["src"]'))
    saved = {p.name: p.read_bytes() for p in src.iterdir()}

    def delete_recreate_edit() -> None:
        shutil.rmtree(src)
        time.sleep(0.6)
        src.mkdir()
        for name, data in saved.items():
            (src / name).write_bytes(data)
        (src / "helper.py").write_text("A = 2\n")
        time.sleep(1.0)  # watched again by now
        (src / "helper.py").write_text("A = 3\n")
        time.sleep(1.0)
        (src / "helper.py").write_text("A = 4\n")

    changes, events = run(watching(config, delete_recreate_edit, settle=2.0))
    said = [e for e in events if isinstance(e, WatchError) and "was deleted" in e.error]
    assert said, events
    again = [e for e in events if isinstance(e, Watching) and e.paths == [str(src)]]
    assert again, events
    # The last two edits, made after the re-creation, each reload.
    assert len(changes) >= 3, [(c.model, [p.name for p in c.paths]) for c in changes]

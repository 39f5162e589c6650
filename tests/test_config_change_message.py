"""An edit of hotreload.toml names the settings that wait for a restart (watch_session.py)."""

from __future__ import annotations

from pathlib import Path

from hotreload.commands.watch_session import changed_settings
from hotreload.config import load_config
from tests.support import make_project


def test_the_message_names_each_changed_model_setting_and_section(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    before = load_config(config)
    text = config.read_text()
    edited = text.replace("threads = 1 ", "threads = 2 ").replace(
        "warmup_iters = 3", "warmup_iters = 1"
    )
    edited = edited.replace("quiet_ms = 100", "quiet_ms = 250")
    second = (
        '\n[[models]]\nname = "other"\nentry = "model.py:build"\n'
        'example = "model.py:example_input"\n'
    )
    config.write_text(edited.replace("[watch]", second + "\n[watch]"))
    after = load_config(config)
    said = changed_settings(before, after)
    assert said == "mlp: warmup_iters, threads; model added: other; watch", said
    assert changed_settings(before, before) == "no setting"
    assert changed_settings(after, before).endswith("model removed: other; watch")

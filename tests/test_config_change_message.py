"""An edit of hotreload.toml sorted into what applies at once, by a reload, and at the next
start, and said in one line (commands/config_edit.py `plan_edit`)."""

from __future__ import annotations

from pathlib import Path

from hotreload.commands.config_edit import plan_edit
from hotreload.config import load_config
from tests.support import make_project


def test_the_plan_names_each_changed_model_setting_and_how_it_applies(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    before = load_config(config)
    text = config.read_text()
    edited = text.replace("warmup_iters = 3", "warmup_iters = 1").replace(
        "quiet_ms = 100", "quiet_ms = 250"
    )
    second = (
        '\n[[models]]\nname = "other"\nentry = "model.py:build"\n'
        'example = "model.py:example_input"\n'
    )
    config.write_text(edited.replace("[watch]", second + "\n[watch]"))
    plan = plan_edit(before, load_config(config))
    assert [m.name for m in plan.live] == ["mlp"] and plan.reloads == []
    assert plan.waiting == ["model added: other", "watch"]
    assert plan.message("hotreload.toml") == (
        "hotreload.toml changed: mlp (warmup_iters): applied, nothing to rebuild; "
        "model added: other, watch: read at start: restart `hotreload watch` to apply them"
    )
    assert (
        plan_edit(before, before).message("hotreload.toml") == "hotreload.toml changed: no setting"
    )


def test_a_section_that_needs_a_restart_applies_nothing_of_itself(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    before = load_config(config)
    config.write_text(
        config.read_text()
        .replace("threads = 1 ", "threads = 2 ")
        .replace('device = "auto"', 'device = "cpu"')
    )
    plan = plan_edit(before, load_config(config))
    assert plan.waiting == ["mlp: device, threads"] and not plan.live and not plan.reloads
    config.write_text(config.read_text().replace("threads = 2 ", "threads = 1 "))
    plan = plan_edit(before, load_config(config))
    assert plan.waiting == ["mlp: device"], "a build on another device needs its lock"


def test_entry_weights_env_and_strategy_reload(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    before = load_config(config)
    (config.parent / "other.safetensors").write_bytes(
        (config.parent / "weights.safetensors").read_bytes()
    )
    config.write_text(
        config.read_text()
        .replace('"weights.safetensors"', '"other.safetensors"')
        .replace('strategy = "inplace"', 'strategy = "respawn"')
        .replace('"expandable_segments:True"', '"expandable_segments:False"')
        .replace("max_queue_size = 256", "max_queue_size = 9")
    )
    plan = plan_edit(before, load_config(config))
    ((model, keys),) = plan.reloads
    assert model.strategy == "respawn"
    assert keys == ("max_queue_size", "weights", "env", "strategy"), keys
    assert plan.message("h.toml") == (
        "h.toml changed: mlp (max_queue_size, weights, env, strategy) reloads with them"
    )

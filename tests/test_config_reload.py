"""An edit of hotreload.toml while `hotreload watch` runs: the model reloads with its new
settings in a fresh worker, a live setting applies at once, a broken one leaves the old
version serving with the old settings, and what needs a restart says so
(commands/config_edit.py, engine/model/settings_change.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hotreload import Client
from tests.support import count_events, read_events, wait_until

X = np.random.default_rng(3).standard_normal((1, 64), dtype=np.float32)


def in_process(project: Path, weights: Path) -> np.ndarray:
    """The example model called in-process with `weights`: what the served one must answer."""
    namespace: dict = {}
    exec(compile((project.parent / "model.py").read_text(), "model.py", "exec"), namespace)
    module = namespace["build"]()
    module.load_state_dict(load_file(str(weights)))
    with torch.no_grad():
        return module.eval()(torch.from_numpy(X)).numpy()


def make_weights(project: Path, name: str, seed: int) -> Path:
    """What the example's make_weights.py writes for `seed` (the module's initial weights
    after torch.manual_seed, saved whole then renamed over `name`), written here: the script
    in a process of its own imported torch again, 2 s of CPU per file (the script itself:
    tests/test_first_day.py)."""
    namespace: dict = {}
    exec(compile((project.parent / "model.py").read_text(), "model.py", "exec"), namespace)
    with torch.random.fork_rng():  # this process's own random state stays as it was
        torch.manual_seed(seed)
        state = {k: v.contiguous() for k, v in namespace["build"]().state_dict().items()}
    out = project.parent / name
    tmp = out.with_name(out.name + ".tmp")
    save_file(state, str(tmp))
    os.replace(tmp, out)  # atomically, as the script does: the watch only sees whole files
    return out


def make_unused_weights(project: Path, name: str, seed: int) -> Path:
    """A weights file no model names yet, once the watcher said so: a config edit naming it
    then changes the settings alone. (Written in the watcher's same quiet window as the
    edit, the file's own change would reload the model a second time, as a file the new
    settings use.)"""
    since = len(read_events(project))
    out = make_weights(project, name, seed)
    wait_until(
        lambda: any(
            e.get("kind") == "file_unused" and e.get("path") == str(out)
            for e in read_events(project)[since:]
        ),
        30,
        what=f"the watcher saying {name} is used by no model",
    )
    return out


def edit_config(project: Path, old: str, new: str) -> None:
    text = project.read_text()
    assert old in text, old
    project.write_text(text.replace(old, new))


def model_status(client: Client) -> dict:
    return client.status()["models"][0]


def config_said(project: Path, text: str, timeout: float = 30.0, since: int = 0) -> str:
    """The detail of the first config_changed event saying `text`, of those after the
    session's first `since` events."""

    def found() -> str | None:
        for e in read_events(project)[since:]:
            if e.get("kind") == "config_changed" and text in str(e.get("detail")):
                return str(e["detail"])
        return None

    return str(wait_until(found, timeout, what=f"config_changed saying {text!r}"))


def test_settings_edits_failed_rebuilt_in_a_fresh_worker_applied_live_and_after_the_last_one(
    project: Path, serve
) -> None:
    """In turn, in one watch session: a settings edit that fails leaves the old version
    serving with the old settings; weights pointed at another file reload in a fresh worker
    that the watcher follows; a live setting applies at once; an edit saved while the last
    one reloads applies after it; and `cpus` waits for a restart."""
    serve(project, "--no-tui", command="watch")
    client = Client(config=project, timeout_s=60)

    # A settings edit that fails.
    v1 = client.infer("mlp", X)
    save_file({"inp.weight": torch.zeros(3, 3)}, str(project.parent / "wrong.safetensors"))
    edit_config(project, 'weights = ["weights.safetensors"]', 'weights = ["wrong.safetensors"]')
    said = config_said(project, "serves on with the settings before")
    assert "mlp's new settings failed in load" in said and "fix hotreload.toml" in said, said
    after = client.infer("mlp", X)
    assert (after.version, after.digest) == (1, v1.digest)
    assert np.array_equal(after.output, v1.output), "the old weights serve on, bit for bit"
    # A code edit now reloads with the settings that serve (weights.safetensors), not the
    # failed ones.
    model = project.parent / "model.py"
    model.write_text(model.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
    wait_until(lambda: model_status(client)["version"] == 2, 60, what="v2 from the code edit")
    np.testing.assert_allclose(client.infer("mlp", X).output, v1.output * 2, rtol=1e-5)
    # Fixing the file applies the edit (compared with what serves, not with the failed one).
    edit_config(project, 'weights = ["wrong.safetensors"]', 'weights = ["weights.safetensors"]')
    config_said(project, "changed: no setting")
    edit_config(project, "warmup_iters = 3", "warmup_iters = 1")
    config_said(project, "mlp (warmup_iters): applied, nothing to rebuild")

    # Weights pointed at another file, saved with the edit (one quiet window: the file's
    # own change must not build the version a second time): one reload in a fresh worker,
    # which the watcher follows.
    first = model_status(client)
    v2 = client.infer("mlp", X)
    since = len(read_events(project))
    other = make_weights(project, "other.safetensors", seed=7)
    edit_config(project, 'weights = ["weights.safetensors"]', 'weights = ["other.safetensors"]')
    said = config_said(project, "mlp (weights) reloads with them", since=since)
    assert "restart" not in said, said
    wait_until(lambda: model_status(client)["version"] == 3, 60, what="v3 with other.safetensors")
    now = model_status(client)
    assert now["pid"] != first["pid"], "new settings build in a fresh worker"
    wait_until(
        lambda: count_events(project, "reload_done", trigger="config", version=3), 30, what="event"
    )
    asked = [e for e in read_events(project)[since:] if e["kind"] == "reload_requested"]
    assert [e["detail"] for e in asked] == ["hotreload.toml: weights"], asked
    v3 = client.infer("mlp", X)
    assert v3.version == 3 and v3.digest != v2.digest
    np.testing.assert_allclose(v3.output, in_process(project, other), rtol=1e-5, atol=1e-6)
    # The watcher follows the new file: saving it reloads, saving the old one reloads nothing.
    make_weights(project, "other.safetensors", seed=8)
    wait_until(lambda: model_status(client)["version"] == 4, 60, what="v4 after saving it")
    np.testing.assert_allclose(
        client.infer("mlp", X).output, in_process(project, other), rtol=1e-5, atol=1e-6
    )
    # (The helper waits for the watcher to say this save unused: an earlier file's
    # file_unused, still in the log, would otherwise let the check below run before it.)
    make_unused_weights(project, "weights.safetensors", seed=9)
    assert model_status(client)["version"] == 4

    # A live setting applies at once; `cpus` is read at start (last: it stays unapplied).
    before = model_status(client)
    asked_before = count_events(project, "reload_requested")
    assert before["queue_limit"] == 256
    edit_config(project, "max_queue_size = 256", "max_queue_size = 7")
    config_said(project, "mlp (max_queue_size): applied, nothing to rebuild")
    wait_until(lambda: model_status(client)["queue_limit"] == 7, 30, what="queue_limit 7")
    now = model_status(client)
    assert (now["version"], now["pid"]) == (before["version"], before["pid"])
    assert count_events(project, "reload_requested") == asked_before

    # An edit saved while the last one reloads applies after it: weights pointed back at
    # weights.safetensors (seed 9 now), then, while v5 builds in its fresh worker (seconds:
    # a process start), at other.safetensors again with a limit changed. That edit is
    # compared with what serves once v5 does: v6 serves v4's weights with the new limit.
    v4 = client.infer("mlp", X)
    since = len(read_events(project))
    edit_config(project, 'weights = ["other.safetensors"]', 'weights = ["weights.safetensors"]')
    config_said(project, "mlp (weights) reloads with them", since=since)
    text = project.read_text().replace('"weights.safetensors"', '"other.safetensors"')
    project.write_text(text.replace("max_queue_size = 7", "max_queue_size = 9"))
    config_said(project, "mlp (max_queue_size, weights) reloads with them", since=since)
    wait_until(lambda: model_status(client)["version"] == 6, 60, what="v6 with the revert")
    assert model_status(client)["queue_limit"] == 9
    back = client.infer("mlp", X)
    assert back.digest == v4.digest and np.array_equal(back.output, v4.output)

    asked_before = count_events(project, "reload_requested")
    edit_config(project, "threads = 1 ", 'threads = 1\ncpus = "off" ')
    said = config_said(project, "mlp: cpus: read at start")
    assert "restart `hotreload watch`" in said, said
    assert count_events(project, "reload_requested") == asked_before


def test_switching_strategy_takes_the_standby_with_it(project: Path, serve) -> None:
    edit_config(project, 'strategy = "inplace"', 'strategy = "respawn"')
    serve(project, "--no-tui", command="watch")
    client = Client(config=project, timeout_s=60)
    wait_until(lambda: model_status(client)["standby"], 60, what="a standby worker")
    standby = model_status(client)["standby"]["pid"]

    edit_config(project, 'strategy = "respawn"', 'strategy = "inplace"')
    wait_until(lambda: model_status(client)["version"] == 2, 60, what="v2 under inplace")
    wait_until(lambda: model_status(client)["standby"] is None, 30, what="the standby stopped")
    assert model_status(client)["strategy"] == "inplace"
    wait_until(lambda: not _alive(standby), 30, what=f"standby pid {standby} gone")

    edit_config(project, 'strategy = "inplace"', 'strategy = "respawn"')
    wait_until(lambda: model_status(client)["version"] == 3, 60, what="v3 under respawn")
    wait_until(lambda: model_status(client)["standby"], 60, what="a new standby")
    assert model_status(client)["standby"]["pid"] != standby
    # A reload now builds in the new standby, which holds the new settings.
    outcome = client.reload("mlp", force=True)["outcomes"][0]
    assert outcome["ok"] and outcome["strategy"] == "respawn", outcome


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

"""Recovery with real worker processes, the example on CPU: what only a real process shows.

The races between reloads, restarts and shutdown (a reload asked for while the worker
restarts, a worker dying in a resource-policy reload, the old worker dying while a respawn
builds, a stop during a reload) are engine behaviour and run on the fake worker through the
port: tests/supervisor/test_supervisor_races.py and test_supervisor_steps.py. A real SIGKILL
and restart under load is tests/test_serve.py's; a real resource-policy reload whose build
fails is tests/test_reload.py's `test_policies_and_strategies`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from hotreload import Client
from tests.support import count_events, make_project, wait_until

X = np.random.default_rng(5).standard_normal((1, 64), dtype=np.float32)


LAYERS = "FACTOR = 1.0\n"
MODEL_WITH_LAYERS = """
import model_base
from layers import FACTOR


def build():
    m = model_base.build()
    forward = m.forward
    m.forward = lambda x: forward(x) * FACTOR
    return m


example_input = model_base.example_input
"""


def test_a_restart_after_a_broken_edit_serves_the_last_good_version_and_reloads_siblings(
    tmp_path: Path, serve
) -> None:
    config = make_project(tmp_path)
    folder = config.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(MODEL_WITH_LAYERS)
    (folder / "layers.py").write_text(LAYERS)
    session = serve(config, "--no-tui", command="watch")
    client = Client(config=config, timeout_s=120)
    expected = client.infer("mlp", X).output
    # A half-finished edit of a module the model imports: its reload fails, and the files
    # on disk no longer build.
    (folder / "layers.py").write_text(LAYERS + "raise ImportError('half-finished edit')\n")
    wait_until(lambda: count_events(config, "reload_failed") == 1, 30, what="the failed reload")
    os.kill(client.status()["models"][0]["pid"], signal.SIGKILL)
    wait_until(lambda: "worker restarted" in session.output, 60, what="restart")
    out, version, _ = client.infer("mlp", X)
    assert version == 1
    np.testing.assert_array_equal(out, expected)
    # The restarted worker loaded v1 from the last good snapshot; the next edit is live code.
    (folder / "layers.py").write_text("FACTOR = 3.0\n")
    wait_until(lambda: client.status()["models"][0]["version"] == 2, 60, what="v2")
    out, version, _ = client.infer("mlp", X)
    assert version == 2
    np.testing.assert_allclose(out, expected * 3, rtol=1e-5)


def test_check_reports_a_model_failing_on_zeros_as_a_failed_step(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    model = config.parent / "model.py"
    model.write_text(
        model.read_text()
        + "\n_forward = MLP.forward\n\n\ndef _checked(self, x):\n"
        + "    if not x.any():\n        raise ValueError('all-zero input refused')\n"
        + "    return _forward(self, x)\n\n\nMLP.forward = _checked\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "hotreload", "check", "--config", str(config), "--reloads", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(config.parent),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL infer" in result.stdout and "all-zero input refused" in result.stdout

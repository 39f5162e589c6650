"""Trips of a new user's first day (issue 31, item 3), each as the user meets it: a real
session, a real edit, the line it prints."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from hotreload import Client
from tests.support import read_events, wait_until

CNN = """
import torch
from torch import nn

SIZE = 32


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def build():
    return SmallCNN()


def example_input():
    return torch.zeros(1, 3, SIZE, SIZE)
"""


def cnn_project(tmp_path: Path, extra: str = "") -> Path:
    proj = tmp_path / "cnn"
    proj.mkdir()
    (proj / "model.py").write_text(CNN)
    config = proj / "hotreload.toml"
    config.write_text(
        '[[models]]\nname = "cnn"\nentry = "model.py:build"\nexample = "model.py:example_input"\n'
        f"threads = 1\nwarmup_iters = 1\n{extra}"
    )
    return config


def test_a_reload_that_changes_the_example_shape_says_inputs_changed(tmp_path: Path, serve) -> None:
    config = cnn_project(tmp_path)
    session = serve(config, "--no-tui", command="watch")
    model = config.parent / "model.py"
    model.write_text(model.read_text().replace("SIZE = 32", "SIZE = 64"))
    session.wait_for("reload -> v2 ok", timeout=60)
    line = next(line for line in session.lines if "reload -> v2 ok" in line)
    assert "inputs changed: input [N,3,32,32] → [N,3,64,64]" in line, line
    (done,) = [e for e in read_events(config) if e["kind"] == "reload_done"]
    assert done["inputs_changed"] == "input [N,3,32,32] → [N,3,64,64]"
    # What the line warns of: the old shape is now refused, the new one served.
    with Client(config=config) as client:
        assert client.infer("cnn", np.zeros((1, 3, 64, 64), np.float32)).version == 2
    # An edit that keeps the shape says nothing of inputs.
    model.write_text(model.read_text().replace(".flatten(1))", ".flatten(1)) * 2"))
    wait_until(lambda: any("reload -> v3" in line for line in session.lines), 60, what="v3")
    line = next(line for line in session.lines if "reload -> v3" in line)
    assert "inputs changed" not in line, line


SLOW_WARM = """
import time
import torch
from torch import nn

PASS_S = 0.0


class Slow(nn.Module):
    def forward(self, x):
        time.sleep(PASS_S)
        return x * 2


def build():
    return Slow()


def example_input():
    return torch.zeros(1, 4)
"""


def test_a_warm_up_past_its_deadline_names_the_key_passes_and_time_per_pass(
    tmp_path: Path, serve
) -> None:
    proj = tmp_path / "slow"
    proj.mkdir()
    (proj / "model.py").write_text(SLOW_WARM)
    config = proj / "hotreload.toml"
    config.write_text(
        '[[models]]\nname = "slow"\nentry = "model.py:build"\nexample = "model.py:example_input"\n'
        "warmup_iters = 6\n[models.deadlines]\nwarm_s = 2.0\n"
    )
    session = serve(config, "--no-tui", command="watch")
    # Each pass now takes 0.8 s: 6 of them need about 5 s, past the 2 s deadline.
    (proj / "model.py").write_text(SLOW_WARM.replace("PASS_S = 0.0", "PASS_S = 0.8"))
    session.wait_for("reload FAILED in warm", timeout=60)
    failed = next(line for line in session.lines if "reload FAILED in warm" in line)
    assert "within its 2 s deadline ([models.deadlines] warm_s)" in failed, failed
    assert re.search(r": [1-3] of 6 pass\(es\) done, [6-9]\d\d ms a pass", failed), failed
    assert "raise warm_s past that, or lower warmup_iters" in failed
    assert "v1 keeps serving" in failed
    # Progress while it ran: a note at least once before the failure.
    notes = [line for line in session.lines if "note: warm-up:" in line]
    assert notes and re.search(r"of 6 pass\(es\) done in \d+\.\d s", notes[0]), session.output
    with Client(config=config) as client:
        assert client.infer("slow", np.zeros((1, 4), np.float32)).version == 1


def test_status_shows_a_dash_not_zero_for_a_window_without_requests() -> None:
    from hotreload.commands.status import format_status

    model = {
        "name": "mlp", "state": "serving", "version": 1, "device": "cpu", "queue_depth": 0,
        "queue_limit": 256, "inflight": 0, "worker": {},
        "latency": {"count": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0},
        "requests": {"ok": 0, "rejected": 0, "timed_out": 0, "failed": 0},
    }  # fmt: skip
    status = {"pid": 1, "uptime_s": 3.0, "socket": "/s", "models": [model]}
    row = format_status(status).splitlines()[2]
    assert "0.00" not in row and row.split()[6:9] == ["-", "-", "-"], row
    model["latency"] = {"count": 5, "p50_ms": 1.5, "p95_ms": 2.0, "p99_ms": 2.5}
    assert "1.50" in format_status(status).splitlines()[2]


def test_make_weights_writes_atomically_beside_the_target(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.support import EXAMPLE

    out = tmp_path / "w.safetensors"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "make_weights.py"), "--seed", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]
    assert "os.replace(tmp, args.out)" in (EXAMPLE / "make_weights.py").read_text()

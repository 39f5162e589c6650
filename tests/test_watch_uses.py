"""Watch what the model uses (issue 28, item 3): `hotreload watch` reloads a model for the
files it imported, declares or is built from, not for every save in its folder. Real files,
real worker processes, tiny models on the CPU."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hotreload import Client
from tests.support import read_events, wait_until

X = np.ones((1, 4), np.float32)

CONFIG = """
[[models]]
name = "{a}"
entry = "{a}.py:build"
example = "{a}.py:example_input"
device = "cpu"
threads = 1
warmup_iters = 1
strategy = "inplace"
{extra_a}
[[models]]
name = "{b}"
entry = "{b}.py:build"
example = "{b}.py:example_input"
device = "cpu"
threads = 1
warmup_iters = 1
strategy = "inplace"

[watch]
quiet_ms = 50
max_wait_ms = 400
"""

MODEL = """
import torch
{imports}

FACTOR = {factor}


class Scaled(torch.nn.Module):
    def forward(self, x):
        return x * FACTOR * {uses}


def build():
    return Scaled()


def example_input():
    return torch.zeros(1, 4)
"""


def write_model(path: Path, factor: float, imports: str = "import helper", uses: str = "helper.K"):
    path.write_text(MODEL.format(imports=imports, factor=factor, uses=uses))


def versions(config: Path) -> dict[str, list[int]]:
    """Per model, the versions its reloads made, in order."""
    out: dict[str, list[int]] = {}
    for e in read_events(config):
        if e["kind"] == "reload_done":
            out.setdefault(e["model"], []).append(e["version"])
    return out


def unused_lines(session) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in session.lines if "not used by any model" in line]


def test_two_models_in_one_folder_reload_for_what_each_uses(tmp_path: Path, serve) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text("K = 1.0\n")
    write_model(proj / "a.py", 2.0)
    write_model(proj / "b.py", 3.0)
    (proj / "client.py").write_text("print('a client script')\n")
    config = proj / "hotreload.toml"
    config.write_text(CONFIG.format(a="a", b="b", extra_a=""))
    session = serve(config, "--no-tui", command="watch")
    wait_until(lambda: session.output.count(" ready on ") >= 2, 90, what="both models ready")
    client = Client(config=config, timeout_s=30)

    write_model(proj / "a.py", 4.0)  # a's own code: a reloads, b does not
    wait_until(lambda: versions(config).get("a") == [2], 30, what="a's reload")
    np.testing.assert_allclose(client.infer("a", X).output, X * 4.0)
    assert "b" not in versions(config), versions(config)

    (proj / "helper.py").write_text("K = 10.0\n")  # imported by both: both reload
    wait_until(lambda: versions(config) == {"a": [2, 3], "b": [2]}, 30, what="both reloads")
    np.testing.assert_allclose(client.infer("b", X).output, X * 30.0)

    (proj / "client.py").write_text("print('edited')\n")  # imported by neither
    wait_until(lambda: unused_lines(session), 30, what="the not-used line")
    (proj / "client.py").write_text("print('edited again')\n")
    time.sleep(0.3)
    write_model(proj / "b.py", 5.0)  # a later reload shows the saves before it were routed
    wait_until(lambda: versions(config).get("b") == [2, 3], 30, what="b's second reload")
    assert versions(config) == {"a": [2, 3], "b": [2, 3]}, "the client script reloaded nothing"
    (line,) = unused_lines(session)  # once per file, not once per save
    assert "client.py" in line, line
    requested = [e["model"] for e in read_events(config) if e["kind"] == "reload_requested"]
    assert sorted(requested) == ["a", "a", "b", "b"], requested


def test_import_list_follows_new_modules_broken_edits_and_failed_starts(
    tmp_path: Path, serve
) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text("K = (\n")  # the first start fails: a syntax error
    write_model(proj / "m.py", 1.0)
    write_model(proj / "other.py", 1.0, imports="", uses="1.0")
    config = proj / "hotreload.toml"
    config.write_text(CONFIG.format(a="m", b="other", extra_a=""))
    session = serve(config, "--no-tui", command="watch", wait_ready=False)
    session.wait_for("m: failed to start", 90)
    session.wait_for("watching ", 30)
    client = Client(config=config, timeout_s=30)

    # No version yet, so no import list: the fix of the helper it failed on brings it up.
    (proj / "helper.py").write_text("K = 1.0\n")
    wait_until(lambda: versions(config).get("m") == [1], 30, what="m up after the fix")
    np.testing.assert_allclose(client.infer("m", X).output, X)

    # A new module is used by nobody until an edit imports it; then its edits reload m.
    (proj / "extra.py").write_text("E = 2.0\n")
    wait_until(lambda: unused_lines(session), 30, what="extra.py not used")
    write_model(proj / "m.py", 1.0, imports="import helper, extra", uses="helper.K * extra.E")
    wait_until(lambda: versions(config).get("m") == [1, 2], 30, what="m importing extra")
    (proj / "extra.py").write_text("E = 5.0\n")
    wait_until(lambda: versions(config).get("m") == [1, 2, 3], 30, what="extra's edit")
    np.testing.assert_allclose(client.infer("m", X).output, X * 5.0)

    # A broken edit imports a module that does not compile: m serves on, the module is
    # watched, and saving its fix reloads m.
    (proj / "broken.py").write_text("B = (\n")
    write_model(proj / "m.py", 1.0, imports="import helper, broken", uses="helper.K * broken.B")
    wait_until(
        lambda: any(e["kind"] == "reload_failed" for e in read_events(config)), 30, what="fail"
    )
    (proj / "broken.py").write_text("B = 7.0\n")
    wait_until(lambda: versions(config).get("m") == [1, 2, 3, 4], 30, what="the fix reloads")
    np.testing.assert_allclose(client.infer("m", X).output, X * 7.0)
    assert "other" not in versions(config), "other imports none of these"

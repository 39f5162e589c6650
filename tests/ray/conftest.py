"""One local Ray cluster for the module, with the example MLP and the tiny LM exported by
`hotreload export ray` and deployed, the MLP with 2 replicas, the LM with 1 (`[ray.models]`).
The cluster is stopped by its process group's pids at teardown, even when a test or the
start-up fails."""

from __future__ import annotations

import importlib.util
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import SHARED

REPO = Path(__file__).resolve().parent.parent.parent


CONFIG = """
[[models]]
name = "mlp"
entry = "mlp/model.py:build"
example = "mlp/model.py:example_input"
weights = ["mlp/weights.safetensors"]
device = "cpu"
threads = 1
warmup_iters = 1
request_timeout_s = 60.0
[models.deadlines]
forward_s = 10.0

[[models]]
name = "gen"
entry = "tiny_lm/model.py:build"
example = "tiny_lm/model.py:example"
device = "cpu"
threads = 1
warmup_iters = 1
request_timeout_s = 60.0
[models.deadlines]
forward_s = 10.0

[ray]
num_replicas = 2
port = {port}

# What is proven on several replicas (a lightweight update on each, a refusal on each, a
# roll under load) is proven on the MLP's; the LM's answers and its replicas left alone by
# the MLP's roll need one, which spares a replica's transformers import (5 s of CPU).
[ray.models.gen]
num_replicas = 1
"""


@dataclass
class Deployed:
    cluster: object  # RayCluster
    project: Path
    out: Path
    port: int


def _export(out: Path, config: Path, result: list[object]) -> None:
    from hotreload.commands.export import export_ray_main

    try:
        result.append(export_ray_main(str(out), str(config), None))
    except BaseException as exc:  # said by the fixture, in the test's thread
        result.append(exc)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    from tests.ray.support_ray import BIN, RayCluster, free_port

    # Not imported here: Ray runs in its own processes, and importing it in the test
    # process would only bring its import-time warnings (errors under filterwarnings).
    if importlib.util.find_spec("ray") is None or not (BIN / "serve").exists():
        pytest.skip("Ray Serve is not installed (pip install -e '.[ray]')")

    tmp = tmp_path_factory.mktemp("ray")
    project = tmp / "proj"
    project.mkdir()
    for name in ("mlp", "tiny_lm"):
        shutil.copytree(
            REPO / "examples" / name, project / name,
            ignore=shutil.ignore_patterns("__pycache__", ".hotreload", "hotreload.toml"),
        )  # fmt: skip
    port = free_port()
    (project / "hotreload.toml").write_text(CONFIG.format(port=port))
    out = tmp / "out"
    # The export (a probe process per model) runs while Ray starts: Ray's start mostly waits
    # on its processes registering (a core idle), 7-8 s of the set-up when run one after
    # the other. The thread is joined before anything else, whatever the start did.
    exported: list[object] = []
    export = threading.Thread(
        target=_export, args=(out, project / "hotreload.toml", exported), name="ray-export"
    )
    export.start()
    try:
        try:
            cluster = RayCluster(http_port=port)
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"a local Ray cluster cannot start here: {str(exc)[-600:]}")
    finally:
        export.join(600)
    SHARED.add(cluster.proc.pid)
    try:
        assert not export.is_alive(), "the export did not finish in 600 s"
        assert exported == [0], exported
        # The request `serve deploy` sends; the CLI itself deploys this file's update in
        # test_bad_update_keeps_the_old_weights_on_every_replica (its start imports Ray: 4 s).
        cluster.put_config(out / "serve_config.yaml")
        cluster.wait_running(["mlp", "gen"])
        yield Deployed(cluster, project, out, cluster.http_port)
    finally:
        cluster.stop()
        SHARED.discard(cluster.proc.pid)
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)

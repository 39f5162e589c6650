"""One local Ray cluster for the module, with the example MLP and the tiny LM exported by
`hotreload export ray` and deployed with 2 replicas each. The cluster is stopped by its
process group's pids at teardown, even when a test or the start-up fails."""

from __future__ import annotations

import importlib.util
import shutil
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
"""


@dataclass
class Deployed:
    cluster: object  # RayCluster
    project: Path
    out: Path
    port: int


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    from hotreload.commands.export import export_ray_main
    from tests.ray.support_ray import BIN, RayCluster

    # Not imported here: Ray runs in its own processes, and importing it in the test
    # process would only bring its import-time warnings (errors under filterwarnings).
    if importlib.util.find_spec("ray") is None or not (BIN / "serve").exists():
        pytest.skip("Ray Serve is not installed (pip install -e '.[ray]')")

    try:
        cluster = RayCluster()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"a local Ray cluster cannot start here: {str(exc)[-600:]}")
    SHARED.add(cluster.proc.pid)
    try:
        tmp = tmp_path_factory.mktemp("ray")
        project = tmp / "proj"
        project.mkdir()
        for name in ("mlp", "tiny_lm"):
            shutil.copytree(
                REPO / "examples" / name, project / name,
                ignore=shutil.ignore_patterns("__pycache__", ".hotreload", "hotreload.toml"),
            )  # fmt: skip
        (project / "hotreload.toml").write_text(CONFIG.format(port=cluster.http_port))
        out = tmp / "out"
        assert export_ray_main(str(out), str(project / "hotreload.toml"), None) == 0
        cluster.deploy(out / "serve_config.yaml")
        cluster.wait_running(["mlp", "gen"])
        yield Deployed(cluster, project, out, cluster.http_port)
    finally:
        cluster.stop()
        SHARED.discard(cluster.proc.pid)
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)

"""`hotreload export ray` without a cluster: what it writes, the options it maps, what it
refuses, and `--weights`. tests/ray runs the result on a real Ray cluster."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hotreload.commands.export import export_ray_main
from hotreload.config import Threads, load_config
from hotreload.errors import ConfigError
from hotreload.export.ray import STATE_FILE, serve_config, to_yaml
from hotreload.export.ray_options import (
    NotExpressible,
    deployment_options,
    read_ray_table,
    request_timeout,
)
from hotreload.http import kserve
from tests.support import make_project

RAY_TABLE = """
[ray]
num_replicas = 2
port = 8123
max_replicas_per_node = 1

[ray.models.mlp]
num_cpus = 2
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("ray-export")
    config = make_project(tmp)
    config.write_text(config.read_text() + RAY_TABLE)
    out = tmp / "out"
    assert export_ray_main(str(out), str(config), None) == 0
    return config, out


def test_the_config_names_one_application_per_model_with_its_zip(
    exported: tuple[Path, Path],
) -> None:
    _, out = exported
    state = json.loads((out / STATE_FILE).read_text())
    doc = serve_config(state)
    assert doc["http_options"] == {"host": "127.0.0.1", "port": 8123, "request_timeout_s": 10.0}
    (app,) = doc["applications"]
    assert app["route_prefix"] == "/v2/models/mlp"
    assert app["import_path"] == "hotreload_ray_app:app"
    zip_uri = app["runtime_env"]["working_dir"]
    assert zip_uri.startswith("file://") and Path(zip_uri[7:]).is_file()
    (d,) = app["deployments"]
    assert d["name"] == "mlp" and d["num_replicas"] == 2 and d["max_replicas_per_node"] == 1
    assert d["ray_actor_options"]["num_cpus"] == 2.0  # [ray.models.mlp] over threads = 1
    assert d["ray_actor_options"]["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    weights = out / "app" / "mlp" / d["user_config"]["weights"][0]
    digest = "sha256:" + hashlib.sha256(weights.read_bytes()).hexdigest()
    assert d["user_config"] == {"weights": ["code/weights.safetensors"], "digest": digest,
                                "version": 1}  # fmt: skip
    yaml = pytest.importorskip("yaml")  # comes with ray[serve]
    assert yaml.safe_load((out / "serve_config.yaml").read_text()) == doc


def test_the_replica_parses_requests_with_hotreloads_own_parser(
    exported: tuple[Path, Path],
) -> None:
    _, out = exported
    path = out / "app" / "mlp" / "hotreload_rules.py"
    text = path.read_text()
    for fn in (kserve.parse_infer_request, kserve.encode_infer_response):
        assert inspect.getsource(fn) in text  # taken from hotreload, not written again
    spec = importlib.util.spec_from_file_location("ray_export_rules", path)
    assert spec is not None and spec.loader is not None
    rules = importlib.util.module_from_spec(spec)
    sys.modules["ray_export_rules"] = rules
    spec.loader.exec_module(rules)
    body = b'{"inputs":[{"name":"x","datatype":"BF16","shape":[2],"data":[1.0,2.5]}]}'
    got = rules.parse_infer_request(body, None)
    want = kserve.parse_infer_request(body, None)
    assert [(t.name, t.dtype, bytes(t.data)) for t in got.inputs] == [
        (t.name, t.dtype, bytes(t.data)) for t in want.inputs
    ]
    with pytest.raises(rules.InferRequestError, match="upper case"):
        rules.parse_infer_request(b'{"inputs":[{"name":"x","datatype":"fp32","shape":[1]}]}', None)


def test_weights_update_names_the_new_file_and_bumps_the_version(
    exported: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = exported
    before = (out / "serve_config.yaml").read_text()
    new = tmp_path / "step-2.safetensors"
    new.write_bytes(b"not even a safetensors file: the replica refuses it, not the export")
    assert export_ray_main(str(out), None, "mlp", [str(new)]) == 0
    user_config = json.loads((out / STATE_FILE).read_text())["models"]["mlp"]["user_config"]
    assert user_config["version"] == 2
    assert user_config["digest"] == "sha256:" + hashlib.sha256(new.read_bytes()).hexdigest()
    copied = Path(user_config["weights"][0])
    assert (
        copied.is_relative_to(out / "weights" / "mlp") and copied.read_bytes() == new.read_bytes()
    )
    after = (out / "serve_config.yaml").read_text()
    # Only user_config changed: the same zip, so `serve deploy` is a lightweight update.
    assert [ln for ln in before.splitlines() if "working_dir" in ln] == [
        ln for ln in after.splitlines() if "working_dir" in ln
    ]
    assert "serve deploy" in capsys.readouterr().out
    assert export_ray_main(str(out), None, "nope", [str(new)]) == 1
    assert export_ray_main(str(out), None, None, [str(new)]) == 2


def test_what_ray_cannot_express_fails_the_export_with_what_to_change(tmp_path: Path) -> None:
    config = load_config(make_project(tmp_path))
    model = config.models[0]
    cases = {
        "Ray picks each replica's GPU": replace(model, device="cuda:1"),
        "by count, not by id": replace(model, cpus=(2, 3)),
        "loads new weights beside": replace(model, policy="resource"),
    }
    for message, m in cases.items():
        with pytest.raises(NotExpressible, match=message):
            deployment_options(m, {})
    with pytest.raises(NotExpressible, match="would hold a GPU it never uses"):
        deployment_options(replace(model, device="cpu"), {"num_gpus": 1})
    other = replace(model, name="other", request_timeout_s=99.0)
    with pytest.raises(NotExpressible, match="one timeout for all"):
        request_timeout([model, other])
    gpu = deployment_options(replace(model, device="cuda", threads=Threads(4, 1)), {})
    assert gpu["ray_actor_options"]["num_gpus"] == 1.0
    assert gpu["ray_actor_options"]["num_cpus"] == 4.0


def test_a_bad_ray_table_names_the_key(tmp_path: Path) -> None:
    path = make_project(tmp_path)
    path.write_text(path.read_text() + "\n[ray]\nnum_replica = 2\n")
    with pytest.raises(ConfigError, match=r"num_replica.*did you mean 'num_replicas'"):
        read_ray_table(load_config(path))
    path.write_text(path.read_text().replace("num_replica = 2", "num_replicas = 0"))
    with pytest.raises(ConfigError, match=r"ray\.num_replicas"):
        read_ray_table(load_config(path))
    path.write_text(path.read_text().replace("num_replicas = 0", "[ray.models.nope]"))
    with pytest.raises(ConfigError, match="nope"):
        read_ray_table(load_config(path))


def test_yaml_of_nested_data() -> None:
    text = to_yaml({"a": [{"b": 1, "c": ["x"]}, 2], "d": {}, "e": "s: t"})
    assert text == 'a:\n  - b: 1\n    c:\n      - "x"\n  - 2\nd: {}\ne: "s: t"'

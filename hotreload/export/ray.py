"""`hotreload export ray OUT_DIR`: the config's models as Ray Serve applications.

Writes, in OUT_DIR:

    serve_config.yaml                 for `serve run` and `serve deploy`: one application per
                                      model, route prefix /v2/models/<name>, its deployment's
                                      options (ray_options.py) and user_config (the weights)
    hotreload_<model>_<hash>.zip      a model's runtime_env working_dir: its code, weights,
                                      the replica (ray_replica.py) and hotreload's rules
    app/<model>/                      the same files, unzipped, to read
    weights/<model>/                  weights files of later updates (--weights)
    .hotreload_ray.json               what serve_config.yaml is written from (--weights)

The zip's name carries its content's hash: Ray caches a working_dir by URI, so a code change
gives a new URI, and `serve deploy` rolls that model's replicas onto it (the others keep
theirs); a weights update changes only user_config (a lightweight update: the replicas
stay). `--model NAME` re-exports one model and keeps the others' entries.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.export.bundle import ROOTS, bundle_source
from hotreload.export.code_copy import CopyError, copy_code
from hotreload.export.ray_options import (
    check_ray_table,
    deployment_options,
    request_timeout,
)
from hotreload.export.triton import ExportError, probe_model

TEMPLATE = Path(__file__).with_name("ray_replica.py")
APP_MODULE = "hotreload_ray_app"
STATE_FILE = ".hotreload_ray.json"
CONFIG_FILE = "serve_config.yaml"
#: What the replica calls from hotreload, besides the loading rules the Triton export takes:
#: the KServe v2 parsing and encoding of hotreload's HTTP front end, its tensor views and
#: its state digest. One source for both, never a second parser.
RAY_ROOTS: dict[str, tuple[str, ...]] = {
    **ROOTS,
    "hotreload.http.kserve": (
        "parse_infer_request",
        "to_router_request",
        "encode_infer_response",
        "model_metadata_doc",
        "InferRequestError",
        "HEADER_LENGTH",
    ),
    "hotreload.worker.inputs": ("request_tensors", "to_device"),
    "hotreload.protocol.tensors": ("encode_tensors",),
    "hotreload.worker.weights_digest": ("state_digest",),
    "hotreload.export.ray": ("file_digest",),
}


def file_digest(paths: list[Path]) -> str:
    """sha256 of the files' bytes in order: user_config's `digest` (ray_replica.py checks it)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def _export_one(config: Config, model: ModelConfig, app: Path, work: Path) -> dict[str, Any]:
    probe = probe_model(config, model, work / "warmup")
    folder = app
    try:
        code = copy_code(config, model, folder, skip=[app.parent, config.state_dir])
    except CopyError as exc:
        raise ExportError(str(exc)) from None
    threads = model.threads
    record = {
        "name": model.name,
        "exported_from": str(config.path),
        "entry": code.entry,
        "example": code.example,
        "weights": code.weights,
        "weights_prefix": model.weights_prefix.to_wire() if model.weights_prefix else None,
        "form": probe["form"],
        "inputs": probe["inputs"],
        "outputs": probe["outputs"],
        "device": model.device,
        "warmup_iters": model.warmup_iters,
        "allow_output_change": model.allow_output_change,
        "threads": {"intra_op": threads.intra_op, "inter_op": threads.inter_op}
        if threads
        else None,
    }
    (folder / "hotreload_export.json").write_text(json.dumps(record, indent=2), "utf-8")
    return record


def _zip(app: Path, out_dir: Path, name: str) -> Path:
    """A zip of `app` named by its content (same files, same name: fixed times, sorted)."""
    files = sorted(p for p in app.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(app).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    target = out_dir / f"hotreload_{name}_{h.hexdigest()[:16]}.zip"
    if not target.exists():
        tmp = target.with_suffix(".zip.part")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                info = zipfile.ZipInfo(p.relative_to(app).as_posix(), (1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, p.read_bytes())
        tmp.rename(target)
    # Older zips of this model: the last one stays (a replica of the previous code may
    # still restart while the new ones roll out).
    mine = [
        p
        for p in out_dir.glob(f"hotreload_{name}_*.zip")
        if len(p.stem) == len(target.stem) and p != target
    ]
    for old in sorted(mine, key=lambda p: p.stat().st_mtime)[:-1]:
        old.unlink()
    return target


def serve_config(state: dict[str, Any]) -> dict[str, Any]:
    """serve_config.yaml's content, from the export's state."""
    apps = []
    for name, m in state["models"].items():
        deployment = {"name": name, **m["options"], "user_config": m["user_config"]}
        apps.append(
            {
                "name": state["app_prefix"] + name,
                "route_prefix": f"/v2/models/{name}",
                "import_path": state.get("import_path", f"{APP_MODULE}:app"),
                "args": {"model": name},
                "runtime_env": {"working_dir": m["working_dir"]},
                "deployments": [deployment],
            }
        )
    return {
        "proxy_location": "EveryNode",
        "http_options": state["http_options"],
        "applications": apps,
    }


def to_yaml(value: Any, indent: int = 0) -> str:
    """YAML for plain data: scalars as JSON (a subset of YAML), so no YAML library is needed."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 2)}")
            else:
                lines.append(f"{pad}{k}: {json.dumps(v)}")
        return "\n".join(lines)
    if isinstance(value, list) and value:
        lines = []
        for v in value:
            text = (
                to_yaml(v, indent + 2)
                if isinstance(v, (dict, list)) and v
                else (" " * (indent + 2) + json.dumps(v))
            )
            lines.append(f"{pad}- {text[indent + 2 :]}")
        return "\n".join(lines)
    return pad + json.dumps(value)


def write_config(out_dir: Path, state: dict[str, Any]) -> Path:
    (out_dir / STATE_FILE).write_text(json.dumps(state, indent=2), "utf-8")
    head = (
        "# Written by `hotreload export ray`; deploy with `serve deploy` (or `serve run`).\n"
        "# A weights update: `hotreload export ray OUT_DIR --model NAME --weights FILE`, then\n"
        "# `serve deploy` again (user_config changes: a lightweight update, no restart).\n"
    )
    path = out_dir / CONFIG_FILE
    tmp = path.with_suffix(".yaml.part")
    tmp.write_text(head + to_yaml(serve_config(state)) + "\n", "utf-8")
    tmp.replace(path)
    return path


def export_ray(
    config: Config, models: list[ModelConfig], out: Path, uri_prefix: str | None
) -> Path:
    """Write OUT_DIR; ExportError/NotExpressible when it cannot be done."""
    ray = check_ray_table(config)
    options = {m.name: deployment_options(m, ray.for_model(m.name)) for m in models}
    timeout = request_timeout(list(config.models))
    out.mkdir(parents=True, exist_ok=True)
    previous = out / STATE_FILE
    # --model NAME re-exports one model and keeps the others' applications as they are
    # (their zips, hence their replicas, unchanged).
    state: dict[str, Any] = (
        json.loads(previous.read_text("utf-8")) if previous.is_file() else {"models": {}}
    )
    state["models"] = {
        k: v for k, v in state["models"].items() if k in {m.name for m in config.models}
    }
    state.update(
        app_prefix=ray.app_prefix,
        http_options={"host": ray.host, "port": ray.port, "request_timeout_s": timeout},
    )
    rules = bundle_source(RAY_ROOTS)
    for m in models:
        work = Path(tempfile.mkdtemp(prefix=f".hotreload-ray-{m.name}.", dir=out))
        try:
            app = work / "app"
            app.mkdir()
            record = _export_one(config, m, app, work)
            shutil.copyfile(TEMPLATE, app / f"{APP_MODULE}.py")
            (app / "hotreload_rules.py").write_text(rules, "utf-8")
            archive = _zip(app, out, m.name)
            target = out / "app" / m.name
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(exist_ok=True)
            app.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        base = uri_prefix.rstrip("/") if uri_prefix else archive.parent.as_uri()
        files = record["weights"]
        state["models"][m.name] = {
            "working_dir": f"{base}/{archive.name}",
            "options": options[m.name],
            "user_config": {
                "weights": files,
                "digest": file_digest([target / f for f in files]),
                "version": 1,
            },
        }
    return write_config(out, state)


def update_weights(out: Path, model: str, files: list[str]) -> tuple[Path, dict[str, Any]]:
    """Copy new weights under OUT_DIR/weights/<model>/ and name them in user_config."""
    state = json.loads((out / STATE_FILE).read_text("utf-8"))
    if model not in state["models"]:
        raise ExportError(f"{out} has no model {model!r}; it has {', '.join(state['models'])}")
    sources = [Path(f).expanduser().resolve() for f in files]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise ExportError(f"no such weights file: {', '.join(missing)}")
    digest = file_digest(sources)
    dest_dir = out / "weights" / model / digest.removeprefix("sha256:")[:16]
    dest_dir.mkdir(parents=True, exist_ok=True)
    dests = []
    for i, src in enumerate(sources):
        dest = dest_dir / (f"{i}_{src.name}" if i else src.name)
        shutil.copyfile(src, dest)
        dests.append(str(dest))
    entry = state["models"][model]
    entry["user_config"] = {
        "weights": dests,
        "digest": digest,
        "version": int(entry["user_config"].get("version", 1)) + 1,
    }
    return write_config(out, state), entry["user_config"]

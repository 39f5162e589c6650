"""`hotreload export triton OUT_DIR`: a Triton model repository for the config's models.

For each model: build it once in a probe process (the worker's own code, so the manager
never imports torch) to learn its input and output signatures and the example's values;
refuse what Triton's config cannot describe; then write, in a staging folder renamed into
place at the end (a failed export leaves no half-written model for Triton to load):

    OUT_DIR/<name>/config.pbtxt        python backend, dims, instance group, warm-up
    OUT_DIR/<name>/warmup/input_N      the example's inputs, raw, for model_warmup
    OUT_DIR/<name>/1/model.py          TritonPythonModel (triton_model.py)
    OUT_DIR/<name>/1/hotreload_rules.py  hotreload's loading rules (bundle.py)
    OUT_DIR/<name>/1/hotreload_export.json  entry points, weights, signatures
    OUT_DIR/<name>/1/code/, weights/   the user's code and weights
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.engine.signature import output_dims
from hotreload.engine.worker_proc import worker_spec
from hotreload.export.bundle import bundle_source
from hotreload.export.code_copy import CodeCopy, CopyError, copy_code
from hotreload.export.triton_config import NotExpressible, model_config

EXPORT_FILE = "hotreload_export.json"
TEMPLATE = Path(__file__).with_name("triton_model.py")


class ExportError(Exception):
    """One model cannot be exported; the message says why and what to change."""


@dataclass
class Exported:
    """What one model's export wrote, for the summary."""

    name: str
    folder: Path
    probe: dict[str, Any]
    config_text: str
    code: CodeCopy
    notes: list[str] = field(default_factory=list)


def probe_model(config: Config, model: ModelConfig, warmup_dir: Path) -> dict[str, Any]:
    """Build the model once in a fresh process; its signatures, or ExportError."""
    spec = worker_spec(model, config)
    spec["warmup_dir"] = str(warmup_dir)
    timeout = model.deadlines.start_s + model.deadlines.load_s + model.deadlines.smoke_s
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hotreload.worker.export_probe"],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=config.root,
        )
    except subprocess.TimeoutExpired:
        raise ExportError(
            f"building the model took over {timeout:.0f} s (deadlines start_s + load_s + "
            "smoke_s); raise them under [models.deadlines] if it is that slow"
        ) from None
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ExportError(
            f"the probe process exited with code {done.returncode} without a reply:\n"
            + done.stderr[-4000:]
        ) from None
    if not reply["ok"]:
        error = reply["error"]
        if error.startswith(("LoadError: ", "SignatureError: ")):
            raise ExportError(error.partition(": ")[2])  # hotreload's own message says it all
        raise ExportError(f"building the model raised {error}\n{reply['traceback']}")
    return reply


def export_model(config: Config, model: ModelConfig, out_dir: Path) -> Exported:
    """Write OUT_DIR/<name>; ExportError when it cannot be done (nothing is left behind)."""
    target = out_dir / model.name
    if target.exists() and not (target / "1" / EXPORT_FILE).is_file():
        raise ExportError(
            f"{target} exists and is not a hotreload export; remove it or choose another OUT_DIR"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model.name}.", dir=out_dir))
    try:
        probe = probe_model(config, model, staging / "warmup")
        try:
            text = model_config(model, probe)
        except NotExpressible as exc:
            raise ExportError(str(exc)) from None
        version_dir = staging / "1"
        try:
            code = copy_code(config, model, version_dir, skip=[out_dir, config.state_dir])
        except CopyError as exc:
            raise ExportError(str(exc)) from None
        (staging / "config.pbtxt").write_text(text, encoding="utf-8")
        shutil.copyfile(TEMPLATE, version_dir / "model.py")
        (version_dir / "hotreload_rules.py").write_text(bundle_source(), encoding="utf-8")
        record = {
            "name": model.name,
            "exported_from": str(config.path),
            "hotreload": _version("hotreload"),
            "entry": code.entry,
            "example": code.example,
            "weights": code.weights,
            "weights_prefix": model.weights_prefix.to_wire() if model.weights_prefix else None,
            "form": probe["form"],
            "inputs": probe["inputs"],
            "outputs": probe["outputs"],
            "weights_digest": probe.get("digest"),
        }
        (version_dir / EXPORT_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    notes = list(probe.get("notes") or [])
    if code.installed:
        notes.append(
            f"{', '.join(code.installed)} is not under {config.root}: it is imported from the "
            "installed package, which Triton's Python environment must have too"
        )
    if code.left_out:
        notes.append(
            f"left out {len(code.left_out)} Python file(s) the model does not import: "
            + ", ".join(code.left_out[:8])
            + (" ..." if len(code.left_out) > 8 else "")
        )
    if code.hotreload_importers:
        notes.append(
            f"{', '.join(code.hotreload_importers)} in 1/code/ "
            f"{'imports' if len(code.hotreload_importers) == 1 else 'import'} hotreload; the "
            "exported model does not need it unless the model's own code imports it"
        )
    return Exported(model.name, target, probe, text, code, notes)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def describe(e: Exported) -> list[str]:
    """The summary lines for one exported model."""
    inputs = e.probe["inputs"]
    lines = [f"exported {e.name!r} to {e.folder}"]
    for i in inputs:
        lines.append(f"  input  {i['name']:<16} {i['dtype']:<9} dims {i['dims']}")
    for o in e.probe["outputs"]:
        lines.append(f"  output {o['name']:<16} {o['dtype']:<9} dims {output_dims(inputs, o)}")
    lines += [
        "  config.pbtxt               python backend, max_batch_size 0 (dimension 0 in dims)",
        "  warmup/                    the example input, for model_warmup",
        "  1/model.py                 TritonPythonModel, with 1/hotreload_rules.py and "
        f"1/{EXPORT_FILE}",
        f"  1/code/                    {e.code.files} files, {_kib(e.code.nbytes)} from "
        + ", ".join(e.code.sources or ["(nothing: installed package)"]),
    ]
    if any(w.startswith("weights/") for w in e.code.weights):
        lines.append("  1/weights/                 the weights files outside the code folder")
    if e.code.weights:
        lines.append(
            f"  weights                    {', '.join(e.code.weights)}: the files' weights, "
            f"digest {e.probe.get('digest') or 'unknown'}"
        )
    params = e.probe.get("parameters") or []
    if params or e.probe.get("any_parameters"):
        lines.append(
            "  request parameters reach the model as keyword arguments: "
            + (", ".join(params) or "any (**kwargs)")
        )
    lines += [f"  note: {n}" for n in e.notes]
    return lines


def requirements(exported: list[Exported]) -> str:
    """What Triton's Python environment must contain, as one sentence."""
    # torch without its local build tag (+cpu here): Triton's machine picks its own build.
    need = {"torch": _version("torch").split("+")[0], "numpy": _version("numpy")}
    if any(w.endswith(".safetensors") for e in exported for w in e.code.weights):
        need["safetensors"] = _version("safetensors")
    for e in exported:
        need.update({k: v.split("+")[0] for k, v in e.code.requires.items()})
    return "Triton's Python environment must contain: " + ", ".join(
        f"{k}=={v}" if v[0].isdigit() else f"{k} ({v})" for k, v in need.items()
    )

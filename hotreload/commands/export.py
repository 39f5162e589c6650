"""`hotreload export triton|ray OUT_DIR`: a Triton model repository, or a Ray Serve
application, from the config (the library is hotreload/export/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hotreload.config import load_config
from hotreload.errors import ConfigError
from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from hotreload.export.export_checks import serving_state, watched_problem, weights_note
from hotreload.export.ray import STATE_FILE, export_ray, update_weights
from hotreload.export.ray_options import NotExpressible as RayNotExpressible
from hotreload.export.triton import Exported, ExportError, describe, export_model, requirements


def export_triton_main(out_dir: str, config_path: str | None, model: str | None) -> int:
    """The command: 0 when every model was exported, 1 when one failed, 2 for the config."""
    try:
        config = load_config(config_path)
        models = [config.model(model)] if model else list(config.models)
    except ConfigError as exc:
        print(f"hotreload export: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(out_dir).expanduser().resolve()
    problem = watched_problem(config, out)
    if problem is not None:
        print(f"hotreload export: {problem}", file=sys.stderr)
        return EXIT_USAGE
    serving = serving_state(config)
    done: list[Exported] = []
    for m in models:
        try:
            done.append(export_model(config, m, out))
        except ExportError as exc:
            print(f"hotreload export: {m.name!r} cannot be exported: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        note = weights_note(m.name, done[-1].probe.get("digest"), serving.get(m.name))
        if note:
            done[-1].notes.append(note)
        print("\n".join(describe(done[-1])))
    print(requirements(done))
    print(f"Start it: tritonserver --model-repository {out} (docs/exports.md)")
    return EXIT_OK


def export_ray_main(
    out_dir: str,
    config_path: str | None,
    model: str | None,
    weights: list[str] | None = None,
    uri_prefix: str | None = None,
) -> int:
    """The command: 0 when written, 1 when a model cannot be exported, 2 for the config."""
    out = Path(out_dir).expanduser().resolve()
    if weights:
        if not model:
            print("hotreload export ray: --weights needs --model NAME", file=sys.stderr)
            return EXIT_USAGE
        try:
            path, user_config = update_weights(out, model, weights)
        except (ExportError, OSError, KeyError, ValueError) as exc:
            print(f"hotreload export ray: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"{path}: {model!r} user_config is now {json.dumps(user_config)}")
        print(f"Apply it without restarting a replica: serve deploy {path}")
        return EXIT_OK
    try:
        config = load_config(config_path)
        models = [config.model(model)] if model else list(config.models)
    except ConfigError as exc:
        print(f"hotreload export: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        path = export_ray(config, models, out, uri_prefix)
    except (ExportError, RayNotExpressible) as exc:
        print(f"hotreload export ray: cannot be exported: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    state = json.loads((out / STATE_FILE).read_text("utf-8"))
    for name in [m.name for m in models]:
        m = state["models"][name]
        o = m["options"]
        count = o.get("num_replicas", "autoscaling")
        print(
            f"exported {name!r}: application {state['app_prefix'] + name}, route "
            f"/v2/models/{name}, {count} replica(s), {o['ray_actor_options']['num_cpus']:g} "
            f"CPU and {o['ray_actor_options']['num_gpus']:g} GPU each"
        )
        print(f"  working_dir: {m['working_dir']}")
        if uri_prefix:
            print(f"  upload {out / Path(m['working_dir']).name} there before deploying")
    print(f"Start it: ray start --head && serve deploy {path}   (docs/ray.md)")
    return EXIT_OK

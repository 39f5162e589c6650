"""`hotreload export triton OUT_DIR`: a Triton model repository from the config (the
library is hotreload/export/)."""

from __future__ import annotations

import sys
from pathlib import Path

from hotreload.config import ConfigError, load_config
from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
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
    done: list[Exported] = []
    for m in models:
        try:
            done.append(export_model(config, m, out))
        except ExportError as exc:
            print(f"hotreload export: {m.name!r} cannot be exported: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        print("\n".join(describe(done[-1])))
    print(requirements(done))
    print(f"Start it: tritonserver --model-repository {out} (README: Moving to Triton and KServe)")
    return EXIT_OK

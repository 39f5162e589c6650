"""Run by `hotreload check --openai` in a subprocess, in this folder (the task YAMLs name
their data relative to it), offline: lm-eval imports slowly and may hang on a broken
server, so the check bounds it with a timeout and never imports it itself.

    python -m hotreload.commands.openai_tasks.run_lmeval RUNS_JSON OUT_JSON

RUNS_JSON: [{"label", "model", "model_args", "tasks", "apply_chat_template"}, ...]. OUT_JSON:
per run its metrics, or the error lm-eval raised (one run failing does not hide the other).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

TASKS = Path(__file__).resolve().parent


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=spec["model"],
        model_args=spec["model_args"],
        tasks=spec["tasks"],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        batch_size=1,
        apply_chat_template=spec.get("apply_chat_template", False),
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )
    if out is None:
        raise RuntimeError("lm-eval returned no results")
    return {
        task: {k: v for k, v in res.items() if isinstance(v, (int, float)) and "," in k}
        for task, res in out["results"].items()
    }


def main() -> int:
    runs = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(level=logging.ERROR)
    results = []
    for spec in runs:
        try:
            results.append({"label": spec["label"], "metrics": run(spec)})
        except Exception as exc:  # reported as that client's failure, with the reason
            results.append(
                {
                    "label": spec["label"],
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
            )
    Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

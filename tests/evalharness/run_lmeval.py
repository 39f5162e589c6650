"""Run lm-eval on the tasks under tests/evalharness/tasks, for one or more models, in one
process (lm-eval is imported once), and write what each run scored as JSON.

    python -m tests.evalharness.run_lmeval RUNS_JSON OUT_JSON

RUNS_JSON: [{"label": "hf", "model": "hf", "model_args": {...}}, ...] (a run may also set
"batch_size", "limit", "apply_chat_template" and "tasks", its own task names; else the
JSON list in $HR_LMEVAL_TASKS, else both tasks). For each run OUT_JSON
holds the metrics per task, every request's responses (loglikelihoods, generations) in
lm-eval's order, and the wall time. Run from the repository root (the task YAMLs name their
data relative to it), offline.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

TASKS = Path(__file__).resolve().parent / "tasks"
TASK_NAMES = ["hr_tiny_mc", "hr_tiny_gen"]


def _plain(value: Any) -> Any:
    """Responses as JSON: lm-eval keeps (loglikelihood, is_greedy) tuples."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return float(value)


def run(spec: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=spec["model"],
        model_args=spec["model_args"],
        tasks=tasks,
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        log_samples=True,
        batch_size=spec.get("batch_size", 1),
        limit=spec.get("limit"),
        # Chat models (local-chat-completions) and `hf` rendering the same template.
        apply_chat_template=spec.get("apply_chat_template", False),
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )
    wall_s = time.perf_counter() - started
    metrics = {
        task: {k: v for k, v in res.items() if isinstance(v, (int, float)) and "," in k}
        for task, res in out["results"].items()
    }
    samples = {
        task: [
            {"doc_id": s["doc_id"], "resps": _plain(s["resps"]), "target": str(s["target"])}
            for s in sorted(rows, key=lambda s: s["doc_id"])
        ]
        for task, rows in out["samples"].items()
    }
    return {"label": spec["label"], "metrics": metrics, "samples": samples, "wall_s": wall_s}


def main() -> int:
    runs = json.loads(Path(sys.argv[1]).read_text())
    tasks = json.loads(os.environ.get("HR_LMEVAL_TASKS", "null")) or TASK_NAMES
    logging.basicConfig(level=logging.WARNING)
    results = [run(spec, spec.get("tasks", tasks)) for spec in runs]
    Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

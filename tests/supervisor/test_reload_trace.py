"""How a reload reads (issue 25): the manager side of a file-edit reload and of a push,
traced over the scripted fake worker (benchmarks/reload_trace.py), stays nearly top to
bottom. The counts depend on the code only, never on timing; the trace runs in a process of
its own, so what earlier tests cached cannot change them.

"returns" are cross-file calls into a file the job had already been in; the event bus is
left out (each phase's start and end is an emit into it, a sink that never calls back).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.reload_trace import SINK, _returns

ROOT = Path(__file__).resolve().parents[2]


def test_a_reload_and_a_push_read_top_to_bottom() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reload_trace.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    traces = {k: [tuple(c) for c in v] for k, v in json.loads(out.stdout).items()}
    edit, push = traces["file edit"], traces["push"]
    assert edit and push, "the trace saw the jobs"
    steps = {k: [c for c in v if c[1] != SINK] for k, v in traces.items()}
    assert _returns(steps["file edit"]) <= 30, steps["file edit"]
    assert _returns(steps["push"]) <= 25, steps["push"]
    # Nothing calls back into the supervisor from the parts it runs.
    callbacks = [c for c in edit + push if c[1] == "engine/model/supervisor.py"]
    assert callbacks == [], callbacks

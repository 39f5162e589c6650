"""How a reload reads (issue 25): the manager side of a file-edit reload and of a push,
traced over the scripted fake worker (benchmarks/reload_trace.py), stays nearly top to
bottom. The counts depend on the code only, never on timing.

"returns" are cross-file calls into a file the job had already been in; the event bus is
left out (each phase's start and end is an emit into it, a sink that never calls back).
"""

from __future__ import annotations

import asyncio

from benchmarks.reload_trace import _returns, measure


def test_a_reload_and_a_push_read_top_to_bottom() -> None:
    traces = asyncio.run(asyncio.wait_for(measure(), 60))
    edit, push = traces["file edit"], traces["push"]
    assert edit.calls and push.calls, "the trace saw the jobs"
    assert _returns(edit.steps) <= 30, edit.steps
    assert _returns(push.steps) <= 25, push.steps
    # Nothing calls back into the supervisor from the parts it runs.
    callbacks = [c for c in edit.calls + push.calls if c[1] == "engine/model/supervisor.py"]
    assert callbacks == [], callbacks

"""`hotreload reload [MODEL]`: ask the running session for a reload, wait, print the outcome.

Meant for an editor key binding: exits 0 when every reload succeeded, 1 when one failed
(the old version keeps serving), 3 when no session runs.
"""

from __future__ import annotations

import json
from typing import Any

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.session_call import call_session


def format_outcome(o: dict[str, Any]) -> str:
    phases = "  ".join(f"{k} {v * 1000:.0f}ms" for k, v in o.get("phases", {}).items())
    if o["ok"] and o.get("unchanged"):
        return f"{o['model']}: {o['detail'][-1] if o.get('detail') else 'unchanged'}"
    if o["ok"]:
        head = f"{o['model']}: reloaded -> v{o['version']} in {o['total_s']:.2f} s"
        return f"{head} ({o['policy']}, {o['strategy']})\n  {phases}"
    text = (
        f"{o['model']}: reload FAILED in {o.get('phase')}: {o.get('error')}\n"
        f"  v{o['version']} keeps serving\n  {phases}"
    )
    if o.get("traceback"):
        text += "\n" + o["traceback"].rstrip()
    return text


def reload_main(
    config: str | None, model: str | None, *, as_json: bool = False, force: bool = False
) -> int:
    """`force`: build even when nothing changed since the serving version's build (by
    default such a reload is a no-op that says "unchanged: nothing to reload")."""
    # No timeout: a reload takes as long as the model's load (its deadlines bound it).
    reply, code = call_session(config, lambda c: c.reload(model, force=force), timeout_s=None)
    if reply is None:
        return code or EXIT_FAILURE
    outcomes = reply.get("outcomes", [])
    if as_json:
        print(json.dumps(outcomes, indent=2))
    else:
        for o in outcomes:
            print(format_outcome(o))
    return EXIT_OK if outcomes and all(o["ok"] for o in outcomes) else EXIT_FAILURE

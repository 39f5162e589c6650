"""`hotreload reload [MODEL]`: ask the running session for a reload, wait, print the outcome.

Meant for an editor key binding: exits 0 when every reload succeeded, 1 when one failed
(the old version keeps serving), 3 when no session runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from hotreload.client import Client
from hotreload.errors import BadRequestError, ClientError, ConfigError, NoServerError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_FAILURE, EXIT_OK, EXIT_USAGE


def format_outcome(o: dict[str, Any]) -> str:
    phases = "  ".join(f"{k} {v * 1000:.0f}ms" for k, v in o.get("phases", {}).items())
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


def reload_main(config: str | None, model: str | None, *, as_json: bool = False) -> int:
    try:
        client = Client(config, timeout_s=None)  # a reload takes as long as the model's load
        reply = client.reload(model)
    except ConfigError as exc:
        print(f"hotreload: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NoServerError as exc:
        print(f"hotreload: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except BadRequestError as exc:
        print(f"hotreload: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        print(f"hotreload: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    outcomes = reply.get("outcomes", [])
    if as_json:
        print(json.dumps(outcomes, indent=2))
    else:
        for o in outcomes:
            print(format_outcome(o))
    return EXIT_OK if outcomes and all(o["ok"] for o in outcomes) else EXIT_FAILURE

"""`hotreload rollback MODEL [VERSION]`: serve a kept version again, wait, print the outcome.

The session keeps the last `keep_versions` good versions of each model (their code
snapshot, weights and pushes: engine/model/kept_versions.py). A rollback builds one of them
again under a new version number, through the same load, warm, smoke and swap as a reload;
exits 0 when it serves, 1 when it failed or is not kept (the serving version keeps
serving), 3 when no session runs.
"""

from __future__ import annotations

from typing import Any

from hotreload.commands.reload import print_outcomes
from hotreload.errors import BadRequestError
from hotreload.exitcodes import EXIT_FAILURE
from hotreload.session_call import call_session


def format_outcome(o: dict[str, Any]) -> str:
    to = o["detail"][0] if o.get("detail") else "to an earlier version"
    phases = "  ".join(f"{k} {v * 1000:.0f}ms" for k, v in o.get("phases", {}).items())
    if o["ok"]:
        weights = f", weights {o['digest']}" if o.get("digest") else ""
        return (
            f"{o['model']}: rollback {to} -> v{o['version']} in {o['total_s']:.2f} s "
            f"({o['policy']}, {o['strategy']}{weights})\n  {phases}"
        )
    text = (
        f"{o['model']}: rollback {to} FAILED in {o.get('phase')}: {o.get('error')}\n"
        f"  v{o['version']} keeps serving\n  {phases}"
    )
    if o.get("traceback"):
        text += "\n" + o["traceback"].rstrip()
    return text


def model_and_version(
    client: Any, model: str | None, version: int | None
) -> tuple[str | None, int | None]:
    """`hotreload rollback 2`: a lone number is the version when the session serves one
    model (and none is named "2"); with several, BadRequestError says to name the model."""
    if version is not None or model is None or not model.isdigit():
        return model, version
    names = [m.get("name") for m in client.status().get("models", [])]
    if model in names:
        return model, None
    if len(names) == 1:
        return names[0], int(model)
    raise BadRequestError(
        f"{model!r} is no model this session serves ({', '.join(map(str, names))}); to roll "
        f"back to v{model}, name the model first: `hotreload rollback MODEL {model}`"
    )


def rollback_main(
    config: str | None, model: str | None, version: int | None, *, as_json: bool = False
) -> int:
    """`version` None: the version that served before the serving one."""
    if version is not None and version < 1:
        print(f"hotreload rollback: VERSION is a version number (1, 2, ...), got {version}")
        return EXIT_FAILURE
    # No timeout: a rollback takes as long as the model's load (its deadlines bound it).
    reply, code = call_session(
        config, lambda c: c.rollback(*model_and_version(c, model, version)), timeout_s=None
    )
    return print_outcomes(reply, code, as_json, format_outcome)

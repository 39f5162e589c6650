"""What an export checks around the copy: that it does not write inside a folder a session
watches, and which weights went out against the ones a live session serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hotreload.config import Config
from hotreload.engine.ignore import IgnoreRules


def watched_problem(config: Config, out: Path) -> str | None:
    """Why writing the export in `out` would set off reloads (it lies in a model's watched
    folder and no ignore rule covers it), with what to do instead; None when it is fine."""
    for m in config.models:
        rules = IgnoreRules((*config.watch.ignore, *m.ignore), extra_dirs=[config.state_dir])
        for folder in m.watch:
            if not (out == folder or folder in out.parents):
                continue
            if rules.ignored(out, folder) or rules.ignored(out / "x", folder):
                continue
            rel = out.relative_to(folder).as_posix()
            return (
                f"{out} is inside {folder}, which hotreload watches for model {m.name!r}: every "
                "file the export writes there would reload it (and a later export would copy "
                f"this one). Write it elsewhere (hotreload export triton "
                f'{folder.parent / out.name}), or add "{rel}/**" to [watch] ignore first'
            )
    return None


def serving_state(config: Config) -> dict[str, dict[str, Any]]:
    """Model name -> its status in a live session of this config ({} with none running)."""
    from hotreload.client import Client

    try:
        with Client(config=config.path, timeout_s=5.0) as client:
            return {m["name"]: m for m in client.status().get("models", [])}
    except Exception:  # no session, or one that does not answer: nothing to compare with
        return {}


def weights_note(name: str, exported: str | None, serving: dict[str, Any] | None) -> str | None:
    """A note when a live session serves other weights than the export took (pushes from a
    trainer, or files saved since), and how to export what serves."""
    if serving is None or not serving.get("digest") or serving.get("digest") == exported:
        return None
    pushes = serving.get("pushes") or 0
    why = f"{pushes} push(es) over the files' weights" if pushes else "the files changed since"
    return (
        f"the session serving this config answers {name!r} with weights {serving['digest']} "
        f"({why}); this export holds the files' weights ({exported or 'digest unknown'}). To "
        "export the serving state, save it into the weights file (the trainer's "
        "state_dict, saved with a temp file and os.replace) and export again"
    )

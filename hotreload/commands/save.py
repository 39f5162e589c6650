"""`hotreload save MODEL DIR`: write the weights a model serves now, pushed ones included.

The running session's worker writes them (engine/model/save.py, worker/save_weights.py):
`model.safetensors` under the model's own names with the digest in its metadata, or a
Hugging Face model's `save_pretrained` folder; `hotreload.json` names version and digest.
Exits 0 when saved, 1 when not (the message says why), 3 when no session runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.session_call import call_session

MIB = 2**20


def format_saved(s: dict[str, Any]) -> str:
    how = "save_pretrained" if s.get("pretrained") else "safetensors"
    return (
        f"{s['model']}: v{s['version']} saved to {s['folder']} ({how}: {s['tensors']} tensors, "
        f"{s['bytes'] / MIB:.1f} MiB, weights {s.get('digest') or 'not hashed'})\n"
        f"  {', '.join(s['files'])}"
    )


def save_main(
    config: str | None,
    model: str | None,
    folder: str,
    *,
    as_json: bool = False,
    force: bool = False,
) -> int:
    target = Path(folder).expanduser().resolve()
    # No timeout: writing a big model takes what reading it takes (deadlines.load_s bounds it).
    reply, code = call_session(config, lambda c: c.save(model, target, force=force), timeout_s=None)
    if reply is None:
        return code or EXIT_FAILURE
    print(json.dumps(reply, indent=2) if as_json else format_saved(reply))
    return EXIT_OK

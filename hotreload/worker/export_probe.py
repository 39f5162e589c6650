"""`python -m hotreload.worker.export_probe`: build a model once, for `hotreload export`.

The manager never imports torch, so this short-lived process builds the model with the
worker's own code (`build_version`, `smoke`) and reports the input and output signatures,
writing the example's tensors as raw files for Triton's `model_warmup`. Spec: JSON on stdin
(a worker spec plus "warmup_dir"). Reply: one JSON line on stdout, {"ok": true, ...} or
{"ok": false, "error": ..., "traceback": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def _probe(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from hotreload.export_layout import warmup_file
    from hotreload.protocol.tensors import encode_tensors
    from hotreload.worker.loader import build_version, pick_device, smoke
    from hotreload.worker.signatures import accepted_parameters

    threads = spec.get("threads")
    if threads:
        torch.set_num_threads(int(threads["intra_op"]))
    # The signature is the same on any device; a GPU is used only where the model asks for
    # one and this machine has it (an export must work on a CPU-only build machine).
    device = pick_device(str(spec.get("device") or "auto") if torch.cuda.is_available() else "cpu")
    mv = build_version(spec, 1, device)
    outputs = smoke(
        mv, None, allow_output_change=True, expected=spec.get("expected_output") or None
    )
    warmup_dir = Path(spec["warmup_dir"])
    warmup_dir.mkdir(parents=True, exist_ok=True)
    host = {k: v.detach().cpu() if hasattr(v, "detach") else v for k, v in mv.example.items()}
    metas, blobs = encode_tensors(host)
    for i, blob in enumerate(blobs):
        (warmup_dir / warmup_file(i)).write_bytes(bytes(blob))
    names, any_kw = accepted_parameters(mv.model)
    # Which weights went out: the same content digest serving shows (status, answers).
    digest = mv.digest
    if digest is None and mv.digest_future is not None:
        digest = mv.digest_future.result(timeout=600)
    return {
        "digest": digest,
        "ok": True,
        "form": mv.example_form,
        "inputs": mv.input_signature,
        "example_shapes": {m["name"]: m["shape"] for m in metas},
        "outputs": outputs,
        "notes": mv.notes,
        "parameters": sorted(names),
        "any_parameters": any_kw,
        "device": str(device),
    }


def main() -> int:
    spec = json.loads(sys.stdin.read())
    os.environ.update(spec.get("env") or {})
    threads = spec.get("threads")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads["intra_op"]))
    # The user's prints must not mix with the reply line.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        reply = _probe(spec)
    except BaseException as exc:  # the user's code may raise anything, SystemExit included
        reply = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    real_stdout.write(json.dumps(reply) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

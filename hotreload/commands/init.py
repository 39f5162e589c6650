"""`hotreload init`: write a commented starter config."""

from __future__ import annotations

import sys
from pathlib import Path

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

STARTER = """\
# hotreload.toml - what hotreload serves and how it reloads it.
# Paths are relative to this file. Every key is optional unless marked "required".
# Every key: docs/configuration.md of hotreload. Check it with: hotreload check (load,
# infer, reload once or more); then hotreload watch serves it and reloads on every save.

# Where the session keeps events.jsonl and its state (it writes its own .gitignore there).
state_dir = ".hotreload"
# Largest request or reply, in MiB.
max_frame_mib = 64

[[models]]
name = "model"                       # required: letters, digits, _ . -
entry = "model.py:build"             # required: "file.py:callable" or "package.module:callable"
                                     #   returning a torch.nn.Module (or any callable)
                                     #   or "model.pt": a TorchScript archive (torch.jit.save)
example = "model.py:example_input"   # required: callable returning an example input
                                     #   (tensor, tuple of tensors, or dict name -> tensor)
# weights = ["weights.safetensors"]  # loaded strictly after build(): .safetensors or
                                     #   .pt/.pth (torch.load with weights_only=True);
                                     #   tied parameters stored once load into each name
# weights_prefix = "inner."          # put in front of the files' keys (a factory that
                                     #   wraps the model); or { strip = "model.", add = "" }
device = "auto"                      # "auto" (first CUDA device, else cpu), "cpu", "cuda:N"
warmup_iters = 3                     # example passes before a version serves
max_queue_size = 256                 # a full queue rejects at once ("Exceeds maximum queue size")
request_timeout_s = 30.0
# max_inflight = 8                   # requests kept in flight inside the worker (pipelining)
threads = 1                          # torch threads; or { intra_op = 2, inter_op = 1 }
# cpus = "auto"                      # CPUs of its own for the serving worker: "auto" (as
                                     #   many as intra-op threads, when one is left for
                                     #   reloads), "off", or ids: [3] or "2-3"
policy = "auto"                      # "availability" (load next, then swap), "resource"
                                     #   (unload first), "auto" (availability if memory allows)
strategy = "inplace"                 # "inplace" (re-import in the same worker) or "respawn"
                                     #   (a fresh worker process per reload)
# standby = true                     # respawn: keep the next worker process started ahead
                                     #   of time, so a reload only builds the model
# recycle = 20                       # respawn: the retired worker (streams synced idle)
                                     #   becomes the next standby this many times; 0 = never
# watch = ["data"]                   # files build() reads: every edit there reloads
                                     #   (code reloads by what the model imports)
# ignore = ["data/**", "*.log"]      # globs never reloaded on
# allow_output_change = false        # let a reload change the output shape or dtype
# build_pace = 3.0                   # while requests flow, a reload's build pauses after
                                     #   each step for 3x its time (max 50 ms): requests keep
                                     #   the CPU; 0 = build at full speed
# expected_output = { shape = [-1, 10], dtype = "float32" }
# shapes = { input_ids = [-1, -1] }  # input dims that may vary (-1); default: dimension 0 only
# generator = true                  # a causal LM (forward returns logits): serve /v1/completions
# tokenizer = "tokenizer/"           # its save_pretrained folder (default: the module's
                                     #   encode/decode)

[models.env]                         # applied in the worker before torch is imported
# PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True"

[models.deadlines]                   # seconds; past one the phase fails (old version serves)
# drain_s = 10.0                     # waits at least forward_s (a long forward is not hung)
# sync_s = 5.0
# load_s = 120.0
# warm_s = 60.0
# smoke_s = 30.0
# forward_s = 60.0                   # a forward longer than this means a wedged worker

[watch]
quiet_ms = 100                       # wait for this much quiet after a save
max_wait_ms = 1500                   # but never longer than this in a burst of saves
# ignore = ["checkpoints/**"]        # globs ignored for every model
# poll = false                       # poll instead of inotify (WSL2 Windows drives, some mounts)

[gpu]
reset = "never"                      # "never", "on-wedge" or "ask" (dev machines only)

[http]                               # KServe v2 / Triton-compatible HTTP API (or --http)
enabled = false
host = "127.0.0.1"
port = 8000
# metrics_port = 8002                # /metrics alone on Triton's metrics port too
# body_timeout_s = 60.0              # a body not in full by then: 408, connection closed
# keepalive_timeout_s = 75.0         # an idle keep-alive connection closes after this
# max_inflated_mib = 64              # gzip/deflate bodies may inflate to this (default:
                                     #   max_frame_mib)

[check]                              # `hotreload check`, the pre-commit smoke check
reloads = 3
leak_threshold_mib = 64
# p99_ms = 50
"""


def write_starter_config(path: str, *, force: bool = False) -> int:
    target = Path(path)
    if target.is_dir():
        target = target / "hotreload.toml"
    if target.exists() and not force:
        print(f"hotreload: {target} already exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_USAGE
    try:
        target.write_text(STARTER, encoding="utf-8")
    except OSError as exc:
        print(f"hotreload: cannot write {target}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(
        f"wrote {target}; edit entry and example to point at your model, then run `hotreload watch`"
    )
    return EXIT_OK

"""How a worker process gets its spec and its control socket: two environment variables.

The engine (`engine/worker_proc.py`) sets them when it starts `python -m hotreload.worker`;
the worker's entry point (`worker/__main__.py`) reads and removes them. One definition for
both ends. This module imports nothing, so the engine may import it without loading the
worker's dependencies, and the worker reads it before torch, numpy or `env` are touched.
"""

#: The worker's spec as JSON (model, entry, device, env, threads, ...).
SPEC_ENV = "HOTRELOAD_WORKER_SPEC"
#: The number of the inherited file descriptor of the worker's end of the control socket.
FD_ENV = "HOTRELOAD_WORKER_FD"

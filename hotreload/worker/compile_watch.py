"""What torch.compile did in this worker: compiles per thread, their seconds, the
Inductor/FX and AOTAutograd cache hits and misses, and dynamo's recompile reasons.

Dynamo is never imported here: importing it costs ~1.6 s, which an eager model's worker
must not pay. `hook()` registers the compile callbacks once the user's code imported it
(a `torch.compile` in build() does); it is called after each build, before its warm-up,
which is where a compiled model's first compile happens.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The cache counters read, as (dynamo counters' group, key, name in our figures).
_CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit", "fx_hit"),
    ("inductor", "fxgraph_cache_miss", "fx_miss"),
    ("aot_autograd", "autograd_cache_hit", "aot_hit"),
    ("aot_autograd", "autograd_cache_miss", "aot_miss"),
)


class _Tally(threading.local):
    """Per thread: a request's compile (serving thread) is told apart from a staged
    version's warm-up compiling on the loader thread at the same time."""

    def __init__(self) -> None:
        self.compiles = 0
        self.seconds = 0.0
        #: CUDA graph recordings (mode="reduce-overhead"): not compiles, counted apart.
        self.recordings = 0
        self.recording_seconds = 0.0
        #: Nesting per trigger on this thread: a compile inside a compile counts once.
        self.depth: dict[str, int] = {}


_tally = _Tally()
_hooked = False
_hook_lock = threading.Lock()

#: The triggers torch/_dynamo/callback.py's CallbackTrigger names, as tallied here.
#: LAZY_BACKWARD (a backward graph compiled on first use; never in inference) and
#: TRITON_AUTOTUNING are neither a compile of the forward nor a recording.
DYNAMO, CUDAGRAPH_RECORDING = "DYNAMO", "CUDAGRAPH_RECORDING"


@contextlib.contextmanager
def _tallied(trigger: Any) -> Iterator[None]:
    """Around one `install_callbacks` block, on the thread that runs it. Dynamo's own
    start/end callbacks run only when its pending counter, one for the whole process, goes
    from 0 to 1 and back: a compile on the loader thread overlapping a CUDA graph recording
    on the serving thread would end on the wrong thread, or not at all."""
    kind = getattr(trigger, "name", str(trigger))
    depth = _tally.depth
    depth[kind] = depth.get(kind, 0) + 1
    started = time.perf_counter()
    try:
        yield
    finally:
        depth[kind] -= 1
        if not depth[kind]:
            took = time.perf_counter() - started
            if kind == DYNAMO:
                _tally.compiles += 1
                _tally.seconds += took
            elif kind == CUDAGRAPH_RECORDING:
                _tally.recordings += 1
                _tally.recording_seconds += took


def _wrap(handler: Any) -> None:
    """Tally every `handler.install_callbacks(trigger, compile_id)` (dynamo's compiles and
    inductor's CUDA graph recordings call it on the instance) on its own thread. Set on the
    instance, so `torch._dynamo.reset()`, which clears the registered callbacks, keeps it."""
    original = handler.install_callbacks

    @contextlib.contextmanager
    def install_callbacks(trigger: Any, compile_id: str) -> Iterator[None]:
        with _tallied(trigger), original(trigger, compile_id):
            yield

    install_callbacks.hotreload_tally = True  # type: ignore[attr-defined]
    handler.install_callbacks = install_callbacks


def hook() -> bool:
    """Tally dynamo's compiles if the user's code imported it (idempotent). True once
    they are tallied."""
    global _hooked
    if _hooked:
        return True
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    with _hook_lock:
        if not _hooked:
            handler = dynamo.callback_handler
            if not getattr(handler.install_callbacks, "hotreload_tally", False):
                _wrap(handler)
            _hooked = True
    return True


def compiles_here() -> int:
    """Compiles dynamo ran on this thread so far (0 before any model imported dynamo)."""
    return _tally.compiles


def use_cache_dir(spec: dict[str, Any], environ: dict[str, str]) -> str | None:
    """Point Inductor's caches (FX graph, AOTAutograd, kernels) at the model's folder in the
    session's state (`spec["compile_cache"]`), so a new worker, a restart and a reverted
    edit find the compiled code again. A TORCHINDUCTOR_CACHE_DIR the user set in the
    model's `env` wins; one merely inherited from the process that started the session
    does not: torch writes its default (/tmp/torchinductor_<user>) into os.environ the
    first time anything compiles in a process, so an inherited value is usually that
    shared default, where other projects' graphs would be read as this model's. Inductor
    reads the variable at each compile, so setting it before the first build is enough."""
    folder = spec.get("compile_cache")
    own = (spec.get("env") or {}).get("TORCHINDUCTOR_CACHE_DIR")
    if not folder or own:
        return own or environ.get("TORCHINDUCTOR_CACHE_DIR")
    environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    # Every code edit adds its graphs and kernels: bounded at each worker's start (a
    # session, a restart, a respawn), before this worker compiles anything.
    trim_cache(Path(folder), CACHE_MAX_BYTES)
    return str(folder)


#: The most a model's compile cache (.hotreload/compile-cache/<model>) keeps: past it the
#: files written longest ago go (a graph not compiled for a while compiles again).
CACHE_MAX_BYTES = 2 * 1024**3


def trim_cache(folder: Path, max_bytes: int) -> int:
    """Delete the oldest files (by modification time) under `folder` until the rest fits
    in `max_bytes`, and the folders that leaves empty. Bytes deleted. Best effort: a file
    another worker removed or still writes is skipped (the cache then misses, no more)."""
    files: list[tuple[float, int, str]] = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.stat(path, follow_symlinks=False)
                files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    freed = 0
    for _, size, path in sorted(files):
        if total - freed <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            freed += size
    if freed:
        for root, _dirs, _names in os.walk(folder, topdown=False):
            if root != str(folder):
                with contextlib.suppress(OSError):
                    os.rmdir(root)  # only empty ones go
    return freed


@dataclass
class CompileFigures:
    """What compiling cost during one stretch of work on this thread (a warm phase)."""

    compiles: int = 0
    seconds: float = 0.0
    #: CUDA graph recordings (mode="reduce-overhead") and their seconds: not compiles.
    recordings: int = 0
    recording_seconds: float = 0.0
    cache: dict[str, int] = field(default_factory=dict)
    #: dynamo's guard failure reasons for the recompiles (why a graph was not reused).
    reasons: list[str] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return self.cache.get("fx_hit", 0) + self.cache.get("aot_hit", 0)

    @property
    def misses(self) -> int:
        return self.cache.get("fx_miss", 0) + self.cache.get("aot_miss", 0)


class Watch:
    """Figures between `Watch()` and `done()` on this thread (nothing when dynamo is not
    imported: an eager model)."""

    def __init__(self) -> None:
        hook()
        self._compiles, self._seconds = _tally.compiles, _tally.seconds
        self._recordings, self._recording_s = _tally.recordings, _tally.recording_seconds
        self._cache = _cache_counts()
        self._reasons = _reason_counts()

    def done(self) -> CompileFigures:
        hook()  # a model that imports dynamo only in its forward: counted from now on
        now = _cache_counts()
        reasons: list[str] = []
        for code, seen in _reason_lists().items():
            reasons.extend(str(r) for r in seen[self._reasons.get(code, 0) :])
        return CompileFigures(
            compiles=_tally.compiles - self._compiles,
            seconds=_tally.seconds - self._seconds,
            recordings=_tally.recordings - self._recordings,
            recording_seconds=_tally.recording_seconds - self._recording_s,
            cache={
                k: v - self._cache.get(k, 0) for k, v in now.items() if v != self._cache.get(k, 0)
            },
            reasons=reasons,
        )

    #: The figures so far (the warm-up asks after its example passes whether it compiled).
    so_far = done


def _counters() -> Any:
    utils = sys.modules.get("torch._dynamo.utils")
    return getattr(utils, "counters", None)


def _cache_counts() -> dict[str, int]:
    counters = _counters()
    if counters is None:
        return {}
    return {name: int(counters[group][key]) for group, key, name in _CACHE_COUNTERS}


def _reason_lists() -> dict[Any, list[Any]]:
    utils = sys.modules.get("torch._dynamo.utils")
    return dict(getattr(utils, "guard_failures", None) or {})


def _reason_counts() -> dict[Any, int]:
    return {code: len(seen) for code, seen in _reason_lists().items()}


def figures_wire(figures: CompileFigures) -> dict[str, Any]:
    """A warm phase's figures as WarmReply.compile carries them."""
    return {
        "compiles": figures.compiles,
        "seconds": round(figures.seconds, 4),
        "recordings": figures.recordings,
        "recording_seconds": round(figures.recording_seconds, 4),
        "hits": figures.hits,
        "misses": figures.misses,
        "cache": dict(figures.cache),
        # The first few: a shape that keeps changing says the same thing for each.
        "reasons": [r[:400] for r in figures.reasons[:5]],
    }


def warm_reply(reply: Any, mv: Any) -> Any:
    """`reply` (a WarmReply) with the version's replay and compile figures filled in."""
    reply.replayed, reply.replay_failed = mv.replayed, list(mv.replay_failed)
    reply.compile = figures_wire(mv.compile) if mv.compile is not None else None
    return reply

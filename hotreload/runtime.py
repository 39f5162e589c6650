"""Helpers user model code may call inside the worker process.

`register_stream` tells hotreload about a CUDA stream the model launches work on, so the
reload's sync phase waits for it (with a deadline) before the old version is released.
torch and cuda-python are imported lazily: this module is importable anywhere.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class RegisteredStream:
    """A stream and the model version that was loading when it was registered."""

    name: str
    version: int | None
    stream: Any


_lock = threading.Lock()
_streams: list[RegisteredStream] = []
_loading_version: int | None = None


def register_stream(stream: Any, name: str | None = None) -> None:
    """Register a torch CUDA stream or a raw `cudaStream_t` handle (an int) for reload sync."""
    if not (hasattr(stream, "query") or isinstance(stream, int)):
        raise TypeError(
            "register_stream expects a torch.cuda.Stream or a raw CUDA stream handle (int), "
            f"got {type(stream).__name__}"
        )
    with _lock:
        label = name or f"user-stream-{len(_streams)}"
        _streams.append(RegisteredStream(label, _loading_version, stream))


def streams_for(version: int | None) -> list[RegisteredStream]:
    """Streams registered while `version` was loading (worker-created ones included)."""
    with _lock:
        return [s for s in _streams if s.version == version]


def forget_streams(version: int | None) -> None:
    with _lock:
        _streams[:] = [s for s in _streams if s.version != version]


def set_loading_version(version: int | None) -> None:
    """Called by the worker's loader around a build, to attribute new streams to it."""
    global _loading_version
    with _lock:
        _loading_version = version

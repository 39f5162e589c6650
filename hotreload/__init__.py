"""hotreload: serve PyTorch models in worker processes and reload them safely on edit.

`from hotreload import Client` is the public entry for user code; other names load lazily
so that `import hotreload` costs nothing for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from hotreload.client import AsyncClient, Client, InferResult
    from hotreload.push_lane import PushHandle

_LAZY = {
    "Client": "hotreload.client",
    "AsyncClient": "hotreload.client",
    "InferResult": "hotreload.client",
    "PushHandle": "hotreload.push_lane",
    "register_stream": "hotreload.runtime",
}

__all__ = [
    "AsyncClient",
    "Client",
    "InferResult",
    "PushHandle",
    "__version__",
    "register_stream",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotreload' has no attribute {name!r}")

"""Helpers for a trainer that evaluates through a hotreload session.

`keep_off_serving_cpus()` (training/cpus.py) moves the trainer off the serving CPUs;
`HotreloadPush` (training/hf.py, needs transformers) pushes from a Hugging Face `Trainer`.
Both load lazily: importing this package costs neither transformers nor the session call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotreload.training.cpus import CpuMove, keep_off_serving_cpus
    from hotreload.training.hf import HotreloadPush

_LAZY = {
    "CpuMove": "hotreload.training.cpus",
    "keep_off_serving_cpus": "hotreload.training.cpus",
    "HotreloadPush": "hotreload.training.hf",
}

__all__ = ["CpuMove", "HotreloadPush", "keep_off_serving_cpus"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotreload.training' has no attribute {name!r}")

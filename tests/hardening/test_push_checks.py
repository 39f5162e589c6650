"""A push is checked against the model from its descriptor, before a byte is read; a dtype
that is not the model's is refused under `strict` (issue 30, items 7 and 12)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hotreload.protocol.shared_state import pack_state
from hotreload.worker.load_error import LoadError
from hotreload.worker.weight_sources import _overlay_state


def model() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


def gone(descriptor: dict) -> dict:
    """The descriptor of a memfd that no longer exists: reading any byte fails."""
    return {**descriptor, "path": "/proc/1/fd/999999"}


def test_an_unknown_name_is_refused_before_anything_is_read() -> None:
    with pack_state({"nope": np.zeros((2, 4), np.float32)}) as packed:
        desc = gone(packed.descriptor)
    with pytest.raises(LoadError, match="does not have: nope"):
        _overlay_state(model(), {"id": 1, "state": desc, "strict": False}, torch.device("cpu"))


def test_a_wrong_shape_is_refused_before_anything_is_read() -> None:
    with pack_state({"weight": np.zeros((3, 4), np.float32)}) as packed:
        desc = gone(packed.descriptor)
    with pytest.raises(LoadError, match=r"shape \[3, 4\], the model's is \[2, 4\]"):
        _overlay_state(model(), {"id": 1, "state": desc, "strict": False}, torch.device("cpu"))


def test_a_float64_push_is_refused_under_strict_and_cast_without() -> None:
    m = model()
    state = {"weight": np.ones((2, 4), np.float64), "bias": np.ones(2, np.float64)}
    with pack_state(state) as packed:
        with pytest.raises(LoadError, match="is float64, the model's is float32; cast it"):
            _overlay_state(
                m, {"id": 1, "state": packed.descriptor, "strict": True}, torch.device("cpu")
            )
        out = _overlay_state(
            m, {"id": 1, "state": packed.descriptor, "strict": False}, torch.device("cpu")
        )
    assert out["weight"].dtype == torch.float32 and float(out["weight"].sum()) == 8.0

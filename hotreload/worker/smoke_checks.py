"""The smoke test's checks of a version's outputs: finite values, for the default adapter
and for each adapter the build touched, and the output signature against the config's
`expected_output`. A NaN pushed into an adapter shows only when that adapter is active, so
each adapter this build read from its file or took from a push runs the example once too;
those shared as they are with the serving version passed their own smoke test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hotreload.worker.load_error import LoadError


def check_finite(outputs: Mapping[str, Any], adapter: str | None = None) -> None:
    """LoadError for an output holding NaN or inf (run with `adapter`, when named)."""
    with_adapter = f" with adapter {adapter!r}" if adapter is not None else ""
    for name, t in outputs.items():
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
            continue  # strings, integers
        finite = torch.isfinite(t)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise LoadError(
                f"smoke test: output {name!r} has {bad} non-finite value(s) (NaN or inf) "
                f"out of {t.numel()} for the example input{with_adapter}"
            )


def check_adapters(mv: Any, outputs_of_example: Callable[[], Mapping[str, Any]]) -> None:
    """The example once with each adapter this build read or took from a push active (but
    the one active now: the example ran with it), its outputs checked finite; the adapter
    active before is active again after (a failure included)."""
    aset = getattr(getattr(mv, "weights", None), "adapters", None)
    if aset is None:
        return
    before = aset.active
    try:
        for name, adapter in aset.adapters.items():
            if adapter.source != "shared" and name != before:
                aset.select(name)
                check_finite(outputs_of_example(), name)
    finally:
        aset.select(before)


def fmt_sig(sig: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['name']} {e['dtype']}{e['shape']}" for e in sig)


def check_expected(sig: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    first = sig[0]
    shape = expected.get("shape")
    if shape is not None and (
        len(shape) != len(first["shape"])
        or any(e != -1 and e != a for e, a in zip(shape, first["shape"], strict=False))
    ):
        raise LoadError(
            f"smoke test: output {first['name']!r} has shape {first['shape']}, the config's "
            f"expected_output.shape is {shape}"
        )
    dtype = expected.get("dtype")
    if dtype is not None and dtype != first["dtype"]:
        raise LoadError(
            f"smoke test: output {first['name']!r} has dtype {first['dtype']}, the config's "
            f"expected_output.dtype is {dtype}"
        )

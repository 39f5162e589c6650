"""The smoke test's comparison of a version's output signature with the config's
`expected_output` (kept out of loader.py, which builds and runs versions)."""

from __future__ import annotations

from typing import Any

from hotreload.worker.load_error import LoadError


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

"""The worker's side of the golden outputs (worker/golden_run.py), in this process: what a
version sends is bounded without ever failing its build, the example's outputs are the smoke
test's own, and each input goes with a digest of its values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from hotreload.engine import golden
from hotreload.worker import golden_run

GOLDEN = """
import torch

def golden():
    return [torch.ones(2, 4)]

def unseeded():
    return [torch.randn(2, 4)]
"""


def version(tmp_path: Path, logits: int) -> Any:
    """A model answering `logits` float32 values per row (its golden inputs written)."""
    (tmp_path / "gold_inputs.py").write_text(GOLDEN)

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], logits) + x.sum()

    mv = SimpleNamespace(
        model=model, example={"x": torch.zeros(100, 4)}, example_form="single",
        device=torch.device("cpu"),
    )  # fmt: skip
    return mv


def spec(tmp_path: Path, attr: str | None = "golden", **more: Any) -> dict[str, Any]:
    path = tmp_path / "gold_inputs.py"
    entry = {"file": str(path), "attr": attr, "spec": f"gold_inputs.py:{attr}"}
    return {"root": str(tmp_path), **({"golden": entry} if attr else {}), **more}


def example_outputs(mv: Any) -> dict[str, Any]:
    return golden_run.snapshot({"output": mv.model(mv.example["x"])})


def test_a_large_example_output_is_left_out_with_one_note_and_the_build_goes_on(
    tmp_path: Path,
) -> None:
    mv = version(tmp_path, 50257)  # 100 x 50257 float32: 19 MiB, past 16 MiB
    wire, blobs, note = golden_run.run(mv, spec(tmp_path), _forward, lambda: None, None)
    assert wire["outputs"][0] is None  # the example: not sent
    assert wire["outputs"][1] is not None  # golden input 1 (2 rows) fits: sent
    assert note is not None and "golden input(s) 0 not compared" in note
    assert "19.2 MiB" in note and "16 MiB" in note and "return them from `golden`" in note
    got = golden.from_wire(wire, b"".join(bytes(b) for b in blobs))
    assert got.outputs[0] is None and got.outputs[1]["output"].shape == (2, 50257)


def test_the_bound_stays_under_the_frame_limit(tmp_path: Path) -> None:
    mv = version(tmp_path, 5000)  # 100 x 5000 float32: 1.9 MiB
    wire, _, note = golden_run.run(
        mv, spec(tmp_path, None, max_frame_bytes=2 * 2**20), _forward, lambda: None, None
    )
    assert golden_run.bound({"max_frame_bytes": 2 * 2**20}) == 2**20
    assert golden_run.bound({}) == golden_run.MAX_BYTES
    assert wire["outputs"] == [None] and note is not None and "past the 1 MiB" in note


def _forward(mv: Any, form: str, named: dict[str, Any]) -> Any:
    return mv.model(*named.values())


def test_the_smoke_tests_outputs_are_reused_and_sent_as_raw_bytes(tmp_path: Path) -> None:
    mv = version(tmp_path, 10)
    calls: list[int] = []

    def forward(mv: Any, form: str, named: dict[str, Any]) -> Any:
        calls.append(next(iter(named.values())).shape[0])
        return mv.model(*named.values())

    smoke = example_outputs(mv)
    wire, blobs, note = golden_run.run(mv, spec(tmp_path), forward, lambda: None, smoke)
    assert calls == [2]  # golden input 1 alone: the example ran in the smoke test
    assert note is None and "data" not in wire["outputs"][0][0]  # no base64
    got = golden.from_wire(wire, b"".join(bytes(b) for b in blobs))
    assert np.array_equal(got.outputs[0]["output"], example_outputs(mv)["output"])
    assert np.array_equal(got.outputs[1]["output"], np.full((2, 10), 8.0, np.float32))


def test_each_input_goes_with_a_digest_of_its_values(tmp_path: Path) -> None:
    mv = version(tmp_path, 10)
    first, _, _ = golden_run.run(mv, spec(tmp_path), _forward, lambda: None, None)
    again, _, _ = golden_run.run(mv, spec(tmp_path), _forward, lambda: None, None)
    assert first["digests"] == again["digests"] and len(first["digests"]) == 2
    one, _, _ = golden_run.run(mv, spec(tmp_path, "unseeded"), _forward, lambda: None, None)
    two, _, _ = golden_run.run(mv, spec(tmp_path, "unseeded"), _forward, lambda: None, None)
    assert one["digests"][0] == two["digests"][0]  # the example: the same tensor
    assert one["digests"][1] != two["digests"][1]  # torch.randn, unseeded

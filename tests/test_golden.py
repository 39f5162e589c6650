"""Golden outputs compared engine-side (engine/golden.py, no torch), their config keys,
and the store `hotreload diff` reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hotreload.commands.diff import diff_main
from hotreload.config import load_config
from hotreload.engine import golden
from hotreload.engine.golden import GoldenMissing, GoldenSet, GoldenStore, GoldenText
from hotreload.errors import ConfigError
from hotreload.exitcodes import EXIT_USAGE
from tests.support import make_project


def logits(scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"output": (rng.standard_normal((2, 10)) * scale).astype(np.float32)}


def test_the_same_outputs_are_identical_and_the_wire_keeps_every_bit() -> None:
    a = GoldenSet((logits(),), seconds=0.01)
    wire, blobs = golden.to_wire(a)
    b = golden.from_wire(wire, b"".join(bytes(x) for x in blobs))
    assert b.outputs[0]["output"].tobytes() == a.outputs[0]["output"].tobytes()
    diff = golden.compare(a, b, old_version=1, new_version=2)
    assert diff["identical"] and diff["same"] and (diff["from"], diff["to"]) == (1, 2)
    assert golden.summary(diff) == "outputs identical on 1 golden input"


def test_a_scaled_output_shows_its_largest_differences_and_no_flip() -> None:
    old, new = GoldenSet((logits(1.0),)), GoldenSet((logits(2.0),))
    diff = golden.compare(old, new)
    e = diff["outputs"][0]
    a = old.outputs[0]["output"].astype(np.float64)
    assert not diff["identical"] and not diff["same"]
    assert e["max_abs"] == pytest.approx(float(np.abs(a).max()))
    assert e["max_rel"] == pytest.approx(1.0)
    assert (e["flips"], e["positions"]) == (0, 2)  # doubling keeps every row's top-1
    assert "output max abs" in golden.summary(diff)


def test_top1_flips_count_the_rows_whose_argmax_moved() -> None:
    old = {"output": np.array([[0.0, 1.0], [1.0, 0.0], [0.2, 0.1]], np.float32)}
    new = {"output": np.array([[1.0, 0.0], [1.0, 0.0], [0.1, 0.2]], np.float32)}
    e = golden.compare(GoldenSet((old,)), GoldenSet((new,)))["outputs"][0]
    assert (e["flips"], e["positions"]) == (2, 3)


def test_tolerance_makes_a_small_change_the_same_but_not_identical() -> None:
    base = logits()
    moved = {"output": base["output"] + np.float32(1e-4)}
    diff = golden.compare(GoldenSet((base,)), GoldenSet((moved,)), tolerance=1e-3)
    assert diff["same"] and not diff["identical"]
    assert golden.summary(diff).startswith("outputs within tolerance 0.001")
    strict = golden.compare(GoldenSet((base,)), GoldenSet((moved,)))
    assert not strict["same"]
    assert 'expect = "any"' in golden.refusal(strict)


def test_a_changed_shape_or_a_new_output_is_a_change() -> None:
    base = logits()
    wider = {"output": np.zeros((2, 11), np.float32)}
    diff = golden.compare(GoldenSet((base,)), GoldenSet((wider,)))
    assert not diff["same"] and "float32[2, 10] -> float32[2, 11]" in golden.summary(diff)
    more = {**base, "extra": np.zeros(1, np.float32)}
    assert not golden.compare(GoldenSet((base,)), GoldenSet((more,)))["same"]


def test_a_generators_texts_name_the_first_differing_token() -> None:
    old = GoldenSet(texts=(GoldenText("Once", (5, 6, 7, 8), "a b c d"),))
    new = GoldenSet(texts=(GoldenText("Once", (5, 6, 9, 8), "a b x d"),))
    diff = golden.compare(old, new)
    t = diff["texts"][0]
    assert t["changed"] and t["first_token"] == 2 and (t["old"], t["new"]) == ("a b c d", "a b x d")
    assert not diff["same"] and "token 2 differs" in golden.summary(diff)
    shorter = GoldenSet(texts=(GoldenText("Once", (5, 6), "a b"),))
    assert golden.compare(old, shorter)["texts"][0]["first_token"] == 2
    assert golden.compare(old, old)["identical"]


def test_the_store_keeps_the_last_versions_and_diff_compares_two(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "g", keep=3)
    for v in range(1, 6):
        store.save(v, GoldenSet((logits(float(v)),), (GoldenText("p", (v,), str(v)),)))
    assert store.versions() == [3, 4, 5]
    fresh = GoldenStore(tmp_path / "g")  # read back from the files, not the cache
    got = fresh.load(4)
    assert got is not None and got.texts[0].tokens == (4,)
    assert got.outputs[0]["output"].tobytes() == logits(4.0)["output"].tobytes()
    diff = golden.diff_kept(fresh, "mlp", None, None, serving=5)
    assert (diff["from"], diff["to"]) == (4, 5) and not diff["identical"]
    assert golden.diff_kept(fresh, "mlp", 5, 5, serving=5)["identical"]
    with pytest.raises(GoldenMissing, match=r"version 1 \(kept: v3, v4, v5"):
        golden.diff_kept(fresh, "mlp", 1, 5, serving=5)
    with pytest.raises(GoldenMissing, match="needs two kept versions"):
        golden.diff_kept(GoldenStore(tmp_path / "none"), "mlp", None, None, serving=None)


def _config(tmp_path: Path, extra: str) -> Path:
    cfg = make_project(tmp_path)
    # The example's own golden line out: each case writes the keys it tests.
    cfg.write_text("\n".join(x for x in cfg.read_text().splitlines() if not x.startswith("golden")))
    text = cfg.read_text().replace('strategy = "inplace"', f'strategy = "inplace"\n{extra}', 1)
    cfg.write_text(text)
    return cfg


def test_config_reads_golden_expect_and_tolerance(tmp_path: Path) -> None:
    cfg = _config(tmp_path, 'golden = "model.py:example_input"\nexpect = "same"\ntolerance = 1e-6')
    m = load_config(cfg).models[0]
    assert m.golden is not None and m.golden.attr == "example_input"
    assert (m.expect, m.tolerance) == ("same", 1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('expect = "identical"', "expect: expected one of any, same"),
        ('expect = "same"\ntolerance = -1', "tolerance: expected the largest absolute"),
        ("tolerance = 0.1", 'set expect = "same" as well'),
        ('golden = "model.py"', "golden: expected 'package.module:callable'"),
        ('golden = "nothere.py:golden"', "golden: file"),
    ],
)
def test_bad_golden_settings_say_what_to_write(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(_config(tmp_path, extra))


# ------------------------------------------------------------------ review findings (issue 42)


def test_inf_at_the_same_place_compares_the_finite_values_and_the_json_is_strict() -> None:
    old = np.array([[1.0, np.inf, 3.0], [np.nan, 0.5, -np.inf]], np.float32)
    new = old.copy()
    new[0, 0] += np.float32(1e-5)  # a tiny change beside the inf
    diff = golden.compare(GoldenSet(({"y": old},)), GoldenSet(({"y": new},)), tolerance=1e-3)
    e = diff["outputs"][0]
    assert diff["same"] and not e["changed"] and "note" not in e, e
    assert e["max_abs"] == pytest.approx(1e-5, rel=1e-2)
    json.dumps(diff, allow_nan=False)  # strict JSON: no NaN, no Infinity
    assert golden.compare(GoldenSet(({"y": old},)), GoldenSet(({"y": old.copy()},)))["identical"]
    huge = np.array([1e308, -1e308])  # finite, but their difference is not
    far = golden.compare(GoldenSet(({"y": huge},)), GoldenSet(({"y": -huge},)))
    assert far["outputs"][0]["note"] == "differences past float64's range" and not far["same"]
    json.dumps(far, allow_nan=False)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.__setitem__((0, 1), np.float32(2.0)),  # inf -> finite
        lambda a: a.__setitem__((0, 1), -np.inf),  # +inf -> -inf
        lambda a: a.__setitem__((1, 0), np.inf),  # nan -> inf
        lambda a: a.__setitem__((1, 1), np.nan),  # finite -> nan
    ],
)
def test_non_finite_values_must_stay_where_they_were_and_of_their_kind(change) -> None:
    old = np.array([[1.0, np.inf, 3.0], [np.nan, 0.5, -np.inf]], np.float32)
    new = old.copy()
    change(new)
    diff = golden.compare(GoldenSet(({"y": old},)), GoldenSet(({"y": new},)), tolerance=10.0)
    e = diff["outputs"][0]
    assert e["changed"] and not diff["same"], e
    assert "non-finite values (inf, nan) differ at 1 of 6 position(s)" in e["note"]
    json.dumps(diff, allow_nan=False)


def test_a_changed_input_is_said_and_never_held_against_the_version() -> None:
    base = logits()
    same_input = (base, {"output": base["output"] * 3})
    old = GoldenSet(same_input, digests=("ex", "seed-1"))
    # Input 1 was fed other values (an unseeded generator): its outputs differ, not compared.
    new = GoldenSet((base, {"output": base["output"] * 5}), digests=("ex", "seed-2"))
    diff = golden.compare(old, new)
    assert diff["same"] and diff["identical"] and diff["compared"] == 1
    assert [e["output"] for e in diff["outputs"]] == ["input 0 output"]
    line = golden.summary(diff)
    assert line.startswith("outputs identical on 1 of 2 golden inputs")
    assert "golden input 1 changed (seed its generator): not compared, not held against" in line
    # An input added to `golden` (and expect = "same"): the others compare, it waits.
    more = GoldenSet((*same_input, base), digests=("ex", "seed-1", "new"))
    grown = golden.compare(old, more)
    assert grown["same"] and "golden input 2 is new" in golden.summary(grown)
    # Everything fed other values: nothing compared, nothing refused.
    moved = GoldenSet(same_input, digests=("ex2", "seed-2"))
    none = golden.compare(old, moved)
    assert none["same"] and not none["identical"] and none["compared"] == 0
    assert golden.summary(none).startswith("no golden input compared; golden input 0 (the ex")


def test_a_changed_prompt_is_left_out_not_refused() -> None:
    old = GoldenSet(texts=(GoldenText("Once", (5, 6), "a b"), GoldenText("Hi", (1,), "x")))
    new = GoldenSet(texts=(GoldenText("Twice", (9, 9), "z z"), GoldenText("Hi", (1,), "x")))
    diff = golden.compare(old, new)
    assert diff["same"] and diff["compared"] == 1 and len(diff["texts"]) == 1
    assert "golden prompt 0 changed" in golden.summary(diff)


def test_a_new_session_clears_the_last_ones_versions(tmp_path: Path) -> None:
    old = GoldenStore(tmp_path / "g")
    old.begin_session({"pid": 1, "started_at": 0.0})
    for v in range(13, 21):  # the last session reached v20
        old.save(v, GoldenSet((logits(float(v)),)))
    store = GoldenStore(tmp_path / "g")
    store.begin_session({"pid": 2, "started_at": 1.0})
    assert store.versions() == [] and store.session() == {"pid": 2, "started_at": 1.0}
    store.save(1, GoldenSet((logits(1.0),)))
    store.save(2, GoldenSet((logits(2.0),)))
    assert GoldenStore(tmp_path / "g").versions() == [1, 2]  # kept, not trimmed by v13..v20


def test_an_unreadable_kept_file_is_a_clear_error(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "g")
    store.save(1, GoldenSet((logits(),)))
    store.path(2).write_bytes(b"not a zip file")
    fresh = GoldenStore(tmp_path / "g")
    with pytest.raises(GoldenMissing, match=r"version 2 .*cannot be read.*delete the file"):
        golden.diff_kept(fresh, "mlp", 1, 2, serving=None)
    # An object array needs pickle to read: refused as unreadable, never unpickled.
    with open(store.path(3), "wb") as f:
        np.savez(f, meta=np.array([{"names": []}], dtype=object))
    with pytest.raises(GoldenMissing, match=r"version 3 .*cannot be read.*ValueError"):
        GoldenStore(tmp_path / "g").load(3)


def _kept_project(tmp_path: Path, extra: str, scale: float) -> Path:
    """A project whose state folder keeps v1 and v2 of an ended session: v2's outputs moved
    by `scale` (absolute) from v1's."""
    cfg = _config(tmp_path, extra)
    store = GoldenStore(load_config(cfg).state_dir / "golden" / "mlp")
    store.begin_session({"pid": 1, "started_at": 0.0})
    base = logits()
    store.save(1, GoldenSet((base,)))
    store.save(2, GoldenSet(({"output": base["output"] + np.float32(scale)},)))
    return cfg


def test_diff_uses_the_configs_tolerance_and_says_which_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _kept_project(tmp_path, 'expect = "same"\ntolerance = 1e-3', 1e-4)
    assert diff_main(str(cfg), "mlp", None, None, as_json=True) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["from"], got["to"], got["same"], got["tolerance"]) == (1, 2, True, 1e-3)
    assert got["session"] == {"pid": 1, "started_at": 0.0, "running": False}
    assert diff_main(str(cfg), "mlp", None, None, tolerance=0.0) == 0
    text = capsys.readouterr().out
    assert text.startswith("v1 -> v2: outputs changed on 1 golden input")
    assert "golden outputs of a session that has ended (pid 1, started" in text
    assert diff_main(str(cfg), "mlp", None, None, tolerance=-1.0) == EXIT_USAGE
    assert "--tolerance -1.0: give the largest absolute difference" in capsys.readouterr().err


def test_the_cli_passes_tolerance(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = _kept_project(tmp_path, "", 1e-4)
    args = [sys.executable, "-m", "hotreload", "diff", "mlp", "--config", str(cfg), "--json"]
    run = subprocess.run([*args, "--tolerance", "1e-3"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["same"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert not json.loads(run.stdout)["same"]

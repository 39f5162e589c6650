"""Golden outputs compared engine-side on every build, over the fake worker: the reload's
event and the status say what changed, each version's outputs are kept for `hotreload
diff`, and `expect = "same"` refuses a version whose outputs changed (the old one serves)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from hotreload.engine import golden
from hotreload.engine.event_kinds import ModelNote, ReloadDone, ReloadFailed
from hotreload.engine.golden import GoldenSet, GoldenStore
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, stepped


def wire(scale: float) -> GoldenSet:
    out = np.arange(10, dtype=np.float32).reshape(1, 10) * np.float32(scale)
    return GoldenSet(({"output": out},), digests=("x",))


@stepped
async def test_a_reload_compares_its_golden_outputs_with_the_serving_versions(
    make: Make,
) -> None:
    script = Script()
    script.goldens = [wire(1.0), wire(2.0), wire(2.0)]
    sup = make(script)
    await sup.start()
    assert (await sup.reload("file")).ok
    done = [e for e in sup.seen if isinstance(e, ReloadDone)]  # type: ignore[attr-defined]
    diff = done[-1].golden
    assert diff is not None and (diff["from"], diff["to"]) == (1, 2)
    assert not diff["identical"] and diff["outputs"][0]["max_abs"] == 9.0
    assert (await sup.status())["golden"]["to"] == 2
    assert (await sup.reload("file")).ok  # the same outputs again
    diff = [e for e in sup.seen if isinstance(e, ReloadDone)][-1].golden  # type: ignore[attr-defined]
    assert diff is not None and diff["identical"] and (diff["from"], diff["to"]) == (2, 3)
    store = GoldenStore(sup.config.state_dir / "golden" / sup.model.name)
    assert store.versions() == [1, 2, 3]
    kept = golden.diff_kept(store, sup.model.name, 1, 2, serving=3)
    assert kept["outputs"][0]["max_abs"] == 9.0


@stepped
async def test_expect_same_refuses_a_changed_version_and_the_old_one_serves(
    make: Make,
) -> None:
    script = Script()
    script.goldens = [wire(1.0), wire(1.5), wire(1.0)]
    sup = make(script, expect="same")
    await sup.start()
    refused = await sup.reload("file")
    assert not refused.ok and refused.phase == "smoke", refused
    assert 'expect = "same"' in (refused.error or "") and "max abs" in (refused.error or "")
    assert sup.version == 1 and sup.state == "serving"
    failed = [e for e in sup.seen if isinstance(e, ReloadFailed)]  # type: ignore[attr-defined]
    assert failed and failed[-1].phase == "smoke"
    kept = GoldenStore(sup.config.state_dir / "golden" / sup.model.name)
    assert kept.versions() == [1]  # a refused version is not kept
    same = await sup.reload("file")  # a refactor: the outputs are bit-equal
    assert same.ok and sup.version == 2, same


@stepped
async def test_tolerance_lets_a_small_change_through_expect_same(make: Make) -> None:
    script = Script()
    script.goldens = [wire(1.0), wire(1.0 + 1e-7)]
    sup = make(script, expect="same", tolerance=1e-5)
    await sup.start()
    outcome = await sup.reload("file")
    assert outcome.ok, outcome
    diff = [e for e in sup.seen if isinstance(e, ReloadDone)][-1].golden  # type: ignore[attr-defined]
    assert diff is not None and diff["same"] and not diff["identical"]


# ------------------------------------------------------------------ review findings (issue 42)


def notes(sup: object) -> list[str]:
    return [e.message for e in sup.seen if isinstance(e, ModelNote)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["availability", "resource"])
def test_a_golden_folder_that_cannot_be_written_is_a_note(tmp_path: Path, policy: str) -> None:
    @stepped
    async def body(make: Make) -> None:
        script = Script()
        script.goldens = [wire(1.0), wire(2.0), wire(3.0)]
        sup = make(script, policy=policy)
        # A file where the golden folder goes: every write to the store fails (OSError).
        sup.config.state_dir.mkdir(parents=True, exist_ok=True)
        (sup.config.state_dir / "golden").write_text("in the way")
        await sup.start()
        for version in (2, 3):
            outcome = await sup.reload("file")
            assert outcome.ok and sup.version == version, outcome
            assert sup.state == "serving"
        said = [n for n in notes(sup) if "golden outputs not kept for `hotreload diff`" in n]
        assert len(said) == 1, notes(sup)  # the same note, said once
        diff = [e for e in sup.seen if isinstance(e, ReloadDone)][-1].golden  # type: ignore[attr-defined]
        assert diff is not None and (diff["from"], diff["to"]) == (2, 3)

    body(tmp_path)


@pytest.mark.parametrize("policy", ["availability", "resource"])
def test_a_failing_comparison_fails_the_smoke_phase_and_the_old_version_serves(
    tmp_path: Path, policy: str
) -> None:
    @stepped
    async def body(make: Make) -> None:
        script = Script()
        script.goldens = [wire(1.0), wire(2.0), wire(2.0)]
        sup = make(script, policy=policy)
        await sup.start()

        def broken(*args: object, **kwargs: object) -> dict:
            raise RuntimeError("a bug in the comparison")

        with mock.patch.object(golden, "compare", broken):
            failed = await sup.reload("file")
        assert not failed.ok and failed.phase == "smoke", failed
        assert "golden outputs could not be compared: RuntimeError: a bug" in (failed.error or "")
        assert sup.version == 1 and sup.state == "serving"
        assert (await sup.reload("file")).ok and sup.version == 2

    body(tmp_path)


@stepped
async def test_reading_and_comparing_run_off_the_event_loop(make: Make) -> None:
    script = Script()
    script.goldens = [wire(1.0), wire(2.0)]
    sup = make(script)
    await sup.start()
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def spy(real):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            threads.append(threading.get_ident())
            return real(*args, **kwargs)

        return run

    with (
        mock.patch.object(golden, "compare", spy(golden.compare)),
        mock.patch.object(golden, "from_wire", spy(golden.from_wire)),
    ):
        assert (await sup.reload("file")).ok
    assert len(threads) == 2 and loop_thread not in threads


@stepped
async def test_an_input_fed_other_values_is_not_compared_and_expect_same_passes(
    make: Make,
) -> None:
    script = Script()
    out = np.arange(10, dtype=np.float32).reshape(1, 10)
    example = {"output": out}
    # A forced reload, no edit: golden input 1 (an unseeded generator) was fed other values.
    script.goldens = [
        GoldenSet((example, {"output": out * 2}), digests=("ex", "a")),
        GoldenSet((example, {"output": out * 7}), digests=("ex", "b")),
        GoldenSet((example, {"output": out * 7}, example), digests=("ex", "b", "c")),
    ]
    sup = make(script, expect="same")
    await sup.start()
    forced = await sup.reload("file")
    assert forced.ok, forced
    diff = [e for e in sup.seen if isinstance(e, ReloadDone)][-1].golden  # type: ignore[attr-defined]
    assert diff is not None and diff["identical"] and diff["compared"] == 1
    assert "golden input 1 changed (seed its generator)" in golden.summary(diff)
    added = await sup.reload("file")  # an input added to `golden`
    assert added.ok, added
    diff = [e for e in sup.seen if isinstance(e, ReloadDone)][-1].golden  # type: ignore[attr-defined]
    assert diff is not None and "golden input 2 is new" in golden.summary(diff)


@stepped
async def test_a_session_clears_the_versions_an_earlier_one_kept(make: Make) -> None:
    script = Script()
    script.goldens = [wire(1.0), wire(2.0)]
    sup = make(script)
    folder = sup.config.state_dir / "golden" / sup.model.name
    old = GoldenStore(folder)
    for v in range(13, 21):  # the session before reached v20
        old.save(v, wire(9.0))
    await sup.start()
    assert (await sup.reload("file")).ok
    store = GoldenStore(folder)
    assert store.versions() == [1, 2]
    marker = store.session()
    assert marker is not None and marker["pid"] == os.getpid()


@stepped
async def test_a_version_whose_outputs_were_not_sent_is_not_compared(make: Make) -> None:
    script = Script()
    # Over the worker's size bound: it sends no outputs for the example (and says why).
    script.goldens = [wire(1.0), GoldenSet((None,), digests=("x",))]
    sup = make(script, expect="same")
    await sup.start()
    outcome = await sup.reload("file")
    assert outcome.ok and sup.version == 2, outcome
    done = [e for e in sup.seen if isinstance(e, ReloadDone)][-1]
    assert done.golden is None  # type: ignore[attr-defined]

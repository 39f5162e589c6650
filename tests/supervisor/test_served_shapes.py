"""The log of served input signatures (engine/served_shapes.py) and its replay in the warm
phase of every build: bounded by count and age, kept across versions and restarts, and
what the warm-up's compile cost carried on the reload's event."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hotreload.engine.event_kinds import ReloadDone
from hotreload.engine.events import EventBus
from hotreload.engine.model import ModelSupervisor
from hotreload.engine.served_shapes import ServedShapes, replayable
from hotreload.http.metrics import SessionMetrics
from hotreload.protocol.tensors import encode_tensors
from tests.supervisor.fake_worker import Script
from tests.supervisor.test_supervisor_steps import Make, stepped


def meta(rows: int, name: str = "x", dtype: str = "float32", cols: int = 4) -> dict:
    return {"name": name, "dtype": dtype, "shape": [rows, cols]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_log_keeps_the_newest_distinct_signatures_up_to_its_limit() -> None:
    log = ServedShapes(limit=3)
    for rows in (1, 2, 3, 2, 4, 5):
        log.note([meta(rows)])
    # 1 and 3 went (least recently seen); 2 was seen again after 3, so it stays.
    assert log.recent() == [[meta(5)], [meta(4)], [meta(2)]]
    assert len(log) == 3


def test_the_log_forgets_a_signature_not_seen_within_its_age() -> None:
    clock = Clock()
    log = ServedShapes(max_age_s=600.0, clock=clock)
    log.note([meta(2)])
    clock.now += 400
    log.note([meta(3)])
    clock.now += 300  # 2 was seen 700 s ago, 3 300 s ago
    assert log.recent() == [[meta(3)]]
    log.note([meta(2)])  # seen again: back
    assert log.recent() == [[meta(2)], [meta(3)]]


def test_strings_and_text_requests_are_not_kept_and_a_bad_limit_says_what_to_fix() -> None:
    log = ServedShapes()
    log.note([])  # a text op's request carries no tensors
    log.note([meta(2, dtype="bytes")])
    assert log.recent() == []
    with pytest.raises(ValueError, match="must be 0 or more"):
        ServedShapes(limit=-1)


def test_replay_keeps_what_the_new_version_accepts_without_its_example() -> None:
    inputs = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]
    logged = [[meta(3)], [meta(1)], [meta(2, dtype="int64")], [meta(2, cols=5)], [meta(7, "in")]]
    # The example's own shape, another dtype and another width are left out; a single
    # input sent under another name is replayed under the model's.
    assert replayable(logged, "single", inputs) == [[meta(3)], [meta(7)]]
    two = [
        {"name": "ids", "dtype": "int64", "shape": [1, 8], "dims": [-1, -1]},
        {"name": "mask", "dtype": "int64", "shape": [1, 8], "dims": [-1, -1]},
    ]
    sent = [{"name": "mask", "dtype": "int64", "shape": [2, 5]}, meta(2, "ids", "int64", 5)]
    # In the version's input order, whatever order the request named them in.
    assert replayable([sent], "dict", two) == [[meta(2, "ids", "int64", 5), sent[0]]]


def submit(sup: ModelSupervisor, rows: int) -> asyncio.Future:
    metas, blobs = encode_tensors({"x": np.zeros((rows, 4), np.float32)})
    return sup.router.submit_future({"tensors": metas}, b"".join(bytes(b) for b in blobs))


@stepped
async def test_every_build_replays_the_served_signatures_across_versions_and_restarts(
    make: Make,
) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    assert script.warm_shapes == [[]]  # nothing served yet
    for rows in (1, 2, 3, 2):
        await submit(sup, rows)
    outcome = await sup.reload("file")
    assert outcome.ok
    # Newest first, the example's own shape (1 x 4: the warm-up's passes) left out.
    assert script.warm_shapes[-1] == [[meta(2)], [meta(3)]]
    await sup.reload("file")  # no request since: the log outlives the version
    assert script.warm_shapes[-1] == [[meta(2)], [meta(3)]]
    script.workers[0].die()
    for _ in range(200):
        if sup.state == "serving" and sup.worker is not script.workers[0]:
            break
        await asyncio.sleep(0.01)
    assert sup.record.restarts == 1
    assert script.warm_shapes[-1] == [[meta(2)], [meta(3)]], "the restart replays the log"


@stepped
async def test_the_reload_event_carries_the_warm_phase_compile_figures(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.warm_compile = {
        "compiles": 2,
        "seconds": 1.5,
        "hits": 3,
        "misses": 1,
        "cache": {"fx_hit": 3, "fx_miss": 1},
        "reasons": ["0/0: tensor 'args[0]' size mismatch at index 0. expected 1, actual 2"],
    }
    outcome = await sup.reload("file")
    assert outcome.ok
    done = [e for e in sup.seen if isinstance(e, ReloadDone)]  # type: ignore[attr-defined]
    assert done[-1].compile == script.warm_compile
    warm = [e for e in sup.seen if e.kind == "phase_end" and e.phase == "warm"]  # type: ignore[attr-defined]
    assert "compiled 1.50 s (2 compiles; cache 3 hit(s), 1 miss(es))" in warm[-1].detail
    assert "recompiled: 0/0: tensor 'args[0]' size mismatch" in warm[-1].detail
    assert (await sup.status())["compile"] == script.warm_compile


@stepped
async def test_metrics_show_compile_seconds_and_requests_that_compiled(make: Make) -> None:
    script = Script()
    sup = make(script)
    await sup.start()
    script.warm_compile = {"compiles": 1, "seconds": 2.5, "hits": 0, "misses": 1, "cache": {}}
    assert (await sup.reload("file")).ok
    script.serving_compiles = 3
    status = await sup.status()
    assert status["worker"]["serving_compiles"] == 3
    metrics = SessionMetrics(SimpleNamespace(models={sup.name: sup}, events=EventBus()))  # type: ignore[arg-type]
    try:
        text = metrics.exposition().decode()
    finally:
        metrics.close()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model") == sup.name
    }
    assert values["hotreload_model_compile_seconds"] == 2.5
    assert values["hotreload_serving_compiles"] == 3


def test_a_repeated_signature_refreshes_its_entry_at_most_once_a_second() -> None:
    # The router notes every request: the same signature as the last one costs a
    # comparison, and its "last seen" is written again only once a second has passed.
    clock = Clock()
    log = ServedShapes(max_age_s=600.0, clock=clock)
    log.note([meta(2)])
    assert log._seen[(("x", "float32", (2, 4)),)] == 1000.0
    clock.now += 0.5
    log.note([meta(2)])
    assert log._seen[(("x", "float32", (2, 4)),)] == 1000.0  # within the second: untouched
    clock.now += 0.6
    log.note([meta(2)])
    assert log._seen[(("x", "float32", (2, 4)),)] == 1001.1
    log.note([meta(3)])  # a new signature: written at once, newest first
    log.note([meta(2, dtype="float16")])  # same shape, another dtype: a signature of its own
    log.note([meta(2, name="y")])
    assert [m[0]["shape"][0] for m in log.recent()] == [2, 2, 3, 2]
    clock.now += 599.5  # 2 x 4 float32 last written 599.5 s ago: kept by a request now
    log.note([meta(2)])
    log.note([meta(2)])
    assert [[meta(2)]] == log.recent()[:1]


@stepped
async def test_replay_shapes_bounds_what_the_warm_phase_replays(make: Make) -> None:
    script = Script()
    sup = make(script, replay_shapes=1)
    await sup.start()
    for rows in (3, 2):
        await submit(sup, rows)
    assert (await sup.reload("file")).ok
    assert script.warm_shapes[-1] == [[meta(2)]]  # the newest only


@stepped
async def test_replay_shapes_0_replays_none(make: Make) -> None:
    script = Script()
    sup = make(script, replay_shapes=0)
    await sup.start()
    await submit(sup, 2)
    assert (await sup.reload("file")).ok
    assert script.warm_shapes[-1] == []


def test_replay_shapes_is_a_count_up_to_what_the_log_keeps(tmp_path: Path) -> None:
    from hotreload.config import load_config
    from hotreload.engine.served_shapes import DEFAULT_LIMIT
    from tests.test_config import GOOD_MODEL, error_for, write

    assert load_config(write(tmp_path, GOOD_MODEL)).models[0].replay_shapes == DEFAULT_LIMIT
    assert (
        load_config(write(tmp_path, GOOD_MODEL + "replay_shapes = 4\n")).models[0].replay_shapes
        == 4
    )
    for bad in ("-1", "17"):
        text = error_for(tmp_path, GOOD_MODEL + f"replay_shapes = {bad}\n")
        assert "replay_shapes" in text and f"between 0 and 16, got {bad}" in text, text
    text = error_for(tmp_path, GOOD_MODEL + 'replay_shapes = "all"\n')
    assert "replay_shapes" in text and "integer" in text, text

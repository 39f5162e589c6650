"""`cpus`: the serving worker on CPUs of its own, everything else on the rest.

The plan is tested against made-up machines (any CPU count, on any test machine) with real
lock files; the placement against a real session, read back from /proc.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hotreload import Client
from hotreload.commands.status import format_status
from hotreload.config import ModelConfig, Threads, load_config
from hotreload.engine.cpus import SUPPORTED, CpuPlan, format_cpus, plan_cpus
from hotreload.engine.session import Session
from hotreload.errors import ConfigError, HotreloadError
from tests.support import count_events, make_project, read_events, wait_until

linux_only = pytest.mark.skipif(not SUPPORTED, reason="CPU affinity is a Linux API")


@pytest.fixture
def model(project: Path) -> ModelConfig:
    return load_config(project).models[0]


def models(base: ModelConfig, *specs: tuple[str, object, int | None]) -> list[ModelConfig]:
    """(name, cpus, intra-op threads) -> model configs."""
    return [
        replace(
            base,
            name=name,
            cpus=cpus,  # type: ignore[arg-type]
            threads=None if threads is None else Threads(threads, 1),
        )
        for name, cpus, threads in specs
    ]


@pytest.fixture
def plans(tmp_path: Path):  # type: ignore[no-untyped-def]
    """plan_cpus with a lock folder of this test; every plan's claims released at the end."""
    made: list[CpuPlan] = []

    def plan(ms: list[ModelConfig], available: set[int]) -> CpuPlan:
        p = plan_cpus(ms, frozenset(available), folder=tmp_path / "locks")
        made.append(p)
        return p

    yield plan
    for p in made:
        p.release()


def test_cpu_lists_print_as_the_kernel_writes_them() -> None:
    assert format_cpus({0, 1, 2, 5}) == "0-2,5"
    assert format_cpus([7]) == "7"
    assert format_cpus({3, 4, 8, 9, 10}) == "3-4,8-10"
    assert format_cpus(()) == ""


@linux_only
def test_auto_gives_each_model_its_threads_worth_of_the_highest_cpus(model, plans) -> None:
    plan = plans(models(model, ("a", "auto", 2), ("b", "auto", 1)), {0, 1, 2, 3})
    assert plan.serving == {"a": {2, 3}, "b": {1}}
    assert plan.rest == {0}
    assert "a serves on CPU 2-3; b serves on CPU 1" in plan.describe()
    assert "reloads and standby workers on CPU 0" in plan.describe()


@linux_only
def test_auto_always_leaves_a_cpu_for_the_rest_and_says_why_it_did_not_pin(
    model, plans, tmp_path: Path
) -> None:
    plan = plans(models(model, ("big", "auto", 2), ("small", "auto", 1)), {0, 1})
    # `big` would take both CPUs: not pinned, and its half-claim is given back for `small`.
    assert plan.serving == {"small": {1}} and plan.rest == {0}
    assert any("big not pinned: it needs 2 CPU(s)" in n for n in plan.notes)
    assert len(plan.claims) == 1
    one = plans(models(model, ("m", "auto", 1)), {0})
    assert one.serving == {} and "m not pinned" in one.notes[0]


@linux_only
def test_auto_without_threads_and_off_pin_nothing(model, plans) -> None:
    plan = plans(models(model, ("free", "auto", None), ("no", "off", 1)), {0, 1, 2, 3})
    assert plan.serving == {} and plan.claims == []
    assert plan.notes == [
        "free not pinned: `threads` is not set, so torch would use every core "
        "(set threads = N to give it N CPUs of its own)"
    ]
    off = plans(models(model, ("no", "off", 1)), {0, 1})
    assert off.serving == {} and off.notes == [] and off.describe() == "no model pinned"


@linux_only
def test_two_sessions_never_claim_the_same_cpu(model, plans) -> None:
    first = plans(models(model, ("m", "auto", 1)), {0, 1, 2, 3})
    second = plans(models(model, ("m", "auto", 1)), {0, 1, 2, 3})
    assert first.serving == {"m": {3}}
    assert second.serving == {"m": {2}}
    # The second session's manager keeps off the first's serving CPU too.
    assert second.rest == {0, 1}
    first.release()
    third = plans(models(model, ("m", "auto", 1)), {0, 1, 2, 3})
    assert third.serving == {"m": {3}}, "a released claim is free again"


@linux_only
def test_a_second_session_on_two_cpus_stays_unpinned(model, plans) -> None:
    plans(models(model, ("m", "auto", 1)), {0, 1})
    second = plans(models(model, ("m", "auto", 1)), {0, 1})
    assert second.serving == {}
    assert "1 of CPU 0-1 are free" in second.notes[0]


@linux_only
def test_explicit_cpus_are_checked_against_the_machine(model, plans) -> None:
    with pytest.raises(ConfigError, match=r"CPU 5 is not available .* may use CPU 0-3"):
        plans(models(model, ("m", (2, 5), 1)), {0, 1, 2, 3})
    with pytest.raises(ConfigError, match="leaves no CPU for the session and reloads"):
        plans(models(model, ("m", (0, 1, 2, 3), 1)), {0, 1, 2, 3})
    with pytest.raises(ConfigError, match="CPU 2 already serves model 'a'"):
        plans(models(model, ("a", (1, 2), 1), ("b", (2,), 1)), {0, 1, 2, 3})
    plan = plans(models(model, ("a", (1,), 1), ("b", "auto", 1)), {0, 1, 2, 3})
    assert plan.serving == {"a": {1}, "b": {3}} and plan.rest == {0, 2}
    # Another session already on CPU 1: an explicit list is the user's call, with a note.
    again = plans(models(model, ("a", (1,), 1)), {0, 1, 2, 3})
    assert again.serving == {"a": {1}}
    assert again.notes == ["a: CPU 1 also serves another hotreload session"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", "auto"),
        ('cpus = "off"', "off"),
        ("cpus = [3, 1]", (1, 3)),
        ('cpus = "2-3,6"', (2, 3, 6)),
        ('cpus = "5"', (5,)),
    ],
)
def test_cpus_config_values(tmp_path: Path, line: str, expected: object) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("threads = 1", f"threads = 1\n{line}"))
    assert load_config(config).models[0].cpus == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("cpus = true", 'expected "auto", "off", a list of CPU ids'),
        ('cpus = "all"', "got 'all'"),
        ('cpus = "3-1"', "range '3-1' runs backwards; write it low-high"),
        ("cpus = [1, 1]", "CPU ids repeat"),
        ("cpus = []", "expected at least one CPU id"),
        ('cpus = [0, "1"]', r"models\[0\]\.cpus\[1\]: expected a CPU id >= 0, got '1'"),
        ('cpus = "0-99999999"', r"CPU id 99999999 is past the largest Linux allows \(8191\)"),
        ("cpus = [9000]", r"CPU id 9000 is past the largest"),
    ],
)
def test_bad_cpus_values_say_what_to_write(tmp_path: Path, line: str, message: str) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("threads = 1", f"threads = 1\n{line}"))
    with pytest.raises(ConfigError, match=message):
        load_config(config)


# ----------------------------------------------------------------------- real placement


def affinities(pid: int) -> dict[int, frozenset[int]]:
    """Thread id -> the CPUs it may run on, as the kernel has it now."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        except OSError:
            pass  # that thread just ended
    return out


needs_two = pytest.mark.skipif(
    not SUPPORTED or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and two CPUs"
)


@needs_two
def test_serving_worker_gets_its_cpu_and_reload_work_the_rest(tmp_path: Path, serve) -> None:
    """respawn: the serving worker on the last CPU, the manager and the standby on the
    others; after a reload the roles, and the CPUs, swap."""
    allowed = frozenset(os.sched_getaffinity(0))
    mine, rest = frozenset({max(allowed)}), allowed - {max(allowed)}
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace('strategy = "inplace"', 'strategy = "respawn"'))
    proc = serve(config)
    assert f"cpus: mlp serves on CPU {max(allowed)}; the session" in proc.output
    client = Client(config=config, timeout_s=60)
    wait_until(lambda: count_events(config, "standby_ready") == 1, 60, what="the standby")

    def check_placement() -> tuple[int, int]:
        serving = client.status()["models"][0]["pid"]
        standby = client.status()["models"][0]["standby"]["pid"]
        assert set(affinities(serving).values()) == {mine}
        assert set(affinities(standby).values()) == {rest}
        assert set(affinities(proc.proc.pid).values()) == {rest}
        return serving, standby

    serving, standby = check_placement()
    shown = format_status(client.status())
    assert f"serving worker on CPU {max(allowed)}, the session and reloads on CPU " in shown
    client.reload("mlp", force=True)
    wait_until(lambda: client.status()["models"][0]["standby"] is not None, 60, what="the standby")
    assert check_placement() == (standby, serving), "the two workers swapped roles"


#: A build that starts a thread of its own (a prefetcher, a pool), as torch's OpenMP pool
#: does for the thread that builds.
BUILD_STARTS_A_THREAD = """
import threading
import time

import model_base


def build():
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    return model_base.build()


example_input = model_base.example_input
"""


@needs_two
def test_an_inplace_build_and_the_threads_it_starts_stay_off_the_serving_cpu(
    tmp_path: Path, serve
) -> None:
    """inplace: the build runs in the serving worker, on its loader thread, which keeps
    itself and every thread a build started on the rest; the serving threads stay."""
    allowed = frozenset(os.sched_getaffinity(0))
    mine, rest = frozenset({max(allowed)}), allowed - {max(allowed)}
    config = make_project(tmp_path)
    folder = config.parent
    (folder / "model.py").rename(folder / "model_base.py")
    (folder / "model.py").write_text(BUILD_STARTS_A_THREAD)
    serve(config)
    client = Client(config=config, timeout_s=60)
    pid = client.status()["models"][0]["pid"]
    # Built before it served: the whole process then moved onto the serving CPU.
    assert set(affinities(pid).values()) == {mine}
    (folder / "model.py").write_text(BUILD_STARTS_A_THREAD + "\n# edited\n")
    assert client.reload("mlp")["outcomes"][0]["ok"]
    assert client.infer("mlp", np.zeros((1, 64), np.float32)).version == 2
    threads = affinities(pid)
    on_rest = [t for t, cpus in threads.items() if cpus == rest]
    # The loader thread, v1's thread (moved back for this build) and v2's.
    assert len(on_rest) == 3, threads
    assert all(cpus == mine for t, cpus in threads.items() if t not in on_rest), threads
    assert client.status()["models"][0]["pid"] == pid


@needs_two
def test_cpus_off_leaves_placement_to_the_scheduler(tmp_path: Path, serve) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("threads = 1", 'threads = 1\ncpus = "off"'))
    proc = serve(config)
    assert "cpus:" not in proc.output
    pid = Client(config=config).status()["models"][0]["pid"]
    assert set(affinities(pid).values()) == {allowed}
    assert not [e for e in read_events(config) if e["kind"] == "cpus"]


@linux_only
def test_cpus_the_machine_lacks_stop_serve_with_a_config_error(tmp_path: Path, serve) -> None:
    config = make_project(tmp_path)
    config.write_text(config.read_text().replace("threads = 1", "threads = 1\ncpus = [999]"))
    proc = serve(config, wait_ready=False)
    assert proc.proc.wait(60) == 2
    proc.wait_for("config error")
    assert "models.mlp.cpus: CPU 999 is not available to this process" in proc.output


@needs_two
def test_an_embedding_process_gets_its_cpus_back(project: Path) -> None:
    """A session inside another program (tests, `hotreload check`) moves that process onto
    the rest while it runs, and back when it stops, or when it fails to open."""
    before = frozenset(os.sched_getaffinity(0))

    async def run() -> tuple[frozenset[int], frozenset[int]]:
        session = Session(load_config(project), endpoint=False, telemetry=False)
        await session.open()
        during = frozenset(os.sched_getaffinity(0))
        await session.stop()
        return during, frozenset(os.sched_getaffinity(0))

    during, after = asyncio.run(run())
    assert during == before - {max(before)}
    assert after == before


@needs_two
def test_a_session_that_fails_to_open_gives_the_cpus_back(tmp_path: Path, serve) -> None:
    """Its socket taken by a running session: open() raises after the CPUs were placed."""
    before = frozenset(os.sched_getaffinity(0))
    config = make_project(tmp_path)
    # Explicit, so the second session pins too although the first holds the claim.
    cpus = f"threads = 1\ncpus = [{max(before)}]"
    config.write_text(config.read_text().replace("threads = 1", cpus))
    serve(config)

    async def run() -> Session:
        session = Session(load_config(config), telemetry=False)
        with pytest.raises(HotreloadError, match="already"):
            await session.open()
        return session

    session = asyncio.run(run())
    assert session.cpu_plan.serving == {"mlp": {max(before)}}
    assert frozenset(os.sched_getaffinity(0)) == before
    assert session.cpu_plan.claims == []

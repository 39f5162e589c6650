"""Shared fixtures. Anything that starts a process cleans it up here, even on failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support import SHARED, ServeProcess, make_project


def _lock_dir() -> str:
    """Reload locks of test sessions live in a folder of this run, not the machine-wide one,
    so a hotreload a developer runs meanwhile neither blocks nor is blocked by the tests.
    Under pytest-xdist (./scripts/test.sh runs `-n`) every worker inherits the controller's
    folder and takes a folder of its own in it: the sessions of tests running at the same
    time on other workers neither hold its reload locks nor claim its CPUs (engine/cpus.py)."""
    run = os.environ.get("HOTRELOAD_LOCK_DIR") or tempfile.mkdtemp(prefix="hotreload-test-locks-")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return run
    own = os.path.join(run, worker)
    os.makedirs(own, mode=0o700, exist_ok=True)
    return own


os.environ["HOTRELOAD_LOCK_DIR"] = _lock_dir()


def _nvidia_gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


#: Test files (or folders) that start real worker processes, servers or clients: marked
#: `real`, left out of the fast tier (`./scripts/test.sh --quick`). A test elsewhere that
#: starts a worker fails in that tier, saying to list its file here or use the fake worker
#: (tests/supervisor/fake_worker.py). Per file for now: some listed files (test_config,
#: test_cpus) are mostly in-process, and move their real tests out as issue 39 goes on.
REAL_FILES = (
    "gpu",
    "ray",
    "triton",
    "tui/test_dashboard_live.py",
    "hardening/test_full_state.py",
    "hardening/test_http_auth.py",
    "hardening/test_one_frame.py",
    "hardening/test_oom_choice.py",
    "hardening/test_push_intake.py",
    "hardening/test_round4_adapters.py",
    "hardening/test_round4_code_on_disk.py",
    "hardening/test_round4_mapped_files.py",
    "hardening/test_round4_override.py",
    "hardening/test_round4_prompts.py",
    "hardening/test_round4_quantized.py",
    "hardening/test_round4_wire.py",
    "hardening/test_unchanged_reload.py",
    "http/test_adapters_http.py",
    "http/test_chat.py",
    "http/test_check_openai.py",
    "http/test_completions.py",
    "http/test_eval_harness.py",
    "http/test_exact_answers.py",
    "http/test_http_endpoint.py",
    "http/test_http_limits.py",
    "http/test_http_repository.py",
    "http/test_input_checks.py",
    "http/test_openai_clients.py",
    "http/test_real_models.py",
    "http/test_streaming.py",
    "test_basics.py",
    "test_check.py",
    "test_checkpoints.py",
    "test_completion_models.py",
    "test_config.py",
    "test_config_reload.py",
    "test_cpus.py",
    "test_dashboard_ops.py",
    "test_deadlines.py",
    "test_docs.py",
    "test_edge_fuzz.py",
    "test_export_triton.py",
    "test_first_day.py",
    "test_fresh_source.py",
    "test_hf_checkpoints.py",
    "test_memory_limits.py",
    "test_preflight.py",
    "test_private_files.py",
    "test_push_copy.py",
    "test_push_delta.py",
    "test_push_leaves.py",
    "test_push_standby.py",
    "test_push_weights.py",
    "test_pushed_state.py",
    "test_recovery.py",
    "test_reload.py",
    "test_reload_lock.py",
    "test_report.py",
    "test_serve.py",
    "test_shared_weights.py",
    "test_standby_preimport.py",
    "test_telemetry.py",
    "test_training_hf.py",
    "test_watch_uses.py",
    "test_weights.py",
    "test_weights_fast.py",
    "test_worker_ops.py",
)
#: Fixtures that start a real session: any test using one is `real` wherever it lives.
REAL_FIXTURES = frozenset({"serve", "http_serve"})
#: Set by `./scripts/test.sh --quick`: the fast tier, where starting a worker is an error.
QUICK_TIER = os.environ.get("HOTRELOAD_TEST_TIER") == "quick"


def _is_real(item: pytest.Item, root: Path) -> bool:
    rel = Path(str(item.path)).relative_to(root).as_posix()
    in_list = any(rel == f or rel.startswith(f + "/") for f in REAL_FILES)
    return in_list or bool(REAL_FIXTURES & set(getattr(item, "fixturenames", ())))


def _shared_fixture_homes(item: pytest.Item) -> set[str]:
    """Where the suite's own fixtures wider than a test that `item` uses are defined (a test
    file, or a conftest's folder): a Ray cluster, a tritonserver, a session shared by a
    module. Fixtures of pytest and its plugins (baseid "") are left out."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {
        fixturedef.baseid
        for name in info.names_closure
        for fixturedef in info.name2fixturedefs.get(name, ())
        if fixturedef.scope != "function" and fixturedef.baseid
    }


def _group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    """Mark the tests that share a fixture wider than a test, directly or through another
    test (a module's server beside its folder's tritonserver), with one `xdist_group`: under
    `-n --dist loadgroup` they run on one worker, so the fixture is made once, not once per
    worker that draws one of them. A group is named by the least of its fixtures' homes, so
    every worker, collecting the same tests, names it alike."""
    root: dict[str, str] = {}

    def find(home: str) -> str:
        while root.setdefault(home, home) != home:
            home = root[home]
        return home

    homes = {item: sorted(_shared_fixture_homes(item)) for item in items}
    for found in homes.values():
        for home in found[1:]:
            a, b = find(found[0]), find(home)
            root[max(a, b)] = min(a, b)
    for item, found in homes.items():
        if found:
            item.add_marker(pytest.mark.xdist_group(find(found[0])))


# tryfirst: before pytest-xdist's own hook reads the xdist_group marks (it names a grouped
# test's node id after its group), and before `-m` deselects by the `real` mark.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent
    for item in items:
        if _is_real(item, root):
            item.add_marker(pytest.mark.real)
    _group_by_shared_fixtures(items)
    # get_closest_marker, not keywords: keywords include folder names (tests/gpu/...).
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if marked and not _nvidia_gpu_present():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi -L found none)")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture(autouse=QUICK_TIER)
def _no_real_worker_in_the_quick_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fast tier a test that starts a worker or a session process fails at once,
    saying what to do, rather than making the tier slow unnoticed."""
    from hotreload.engine.worker_proc import WorkerProcess

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "this test starts a real worker process, which the quick tier "
            "(./scripts/test.sh --quick) leaves out: add its file to REAL_FILES in "
            "tests/conftest.py, or test it on the fake worker (tests/supervisor/fake_worker.py)"
        )

    monkeypatch.setattr(WorkerProcess, "start", refuse)
    monkeypatch.setattr(ServeProcess, "__init__", refuse)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example MLP project in a temporary folder; returns its config path."""
    return make_project(tmp_path)


@pytest.fixture
def serve() -> Iterator[ServeProcess.Factory]:
    """Start `hotreload serve` processes; every one is stopped (then killed) at teardown."""
    started: list[ServeProcess] = []

    def factory(
        config: Path,
        *args: str,
        wait_ready: bool = True,
        command: str = "serve",
        env: dict[str, str] | None = None,
        process_cls: type[ServeProcess] = ServeProcess,
    ) -> ServeProcess:
        proc = process_cls(config, *args, command=command, env=env)
        started.append(proc)
        if wait_ready:
            proc.wait_ready()
        return proc

    yield factory
    for proc in started:
        proc.close()


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    """Fail a test that leaves a child process of ours behind (after its fixtures ran).
    Trees under a pid in `tests.support.SHARED` (a module's shared server) are left alone."""
    yield
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 10
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline:
        kids = [p for p in me.children(recursive=True) if _counts(p)]
        if not kids:
            return
        time.sleep(0.1)
    described = []
    for p in kids:
        try:
            described.append((p.pid, " ".join(p.cmdline())[:100]))
            os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    pytest.fail(f"leftover child processes: {described}", pytrace=False)


def _counts(p: psutil.Process) -> bool:
    """A live child that no shared server of a module owns."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        chain = [p, *p.parents()]
    except psutil.NoSuchProcess:
        return False
    return not any(q.pid in SHARED for q in chain)

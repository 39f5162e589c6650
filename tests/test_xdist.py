"""The suite on several processes (`./scripts/test.sh` runs pytest-xdist's `-n`): every
worker keeps its sessions' reload locks and CPU claims in a folder of its own, and the tests
sharing a fixture wider than a test (a module's server, a Ray cluster) run on one worker, so
it is made once (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import _group_by_shared_fixtures, _lock_dir
from tests.support import REPO
from tests.test_tiers import UNUSED_PLUGINS


def test_each_xdist_worker_locks_in_a_folder_of_its_own_inside_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "locks"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("HOTRELOAD_LOCK_DIR", str(run))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert _lock_dir() == str(run)  # one process: the run's folder itself
    folders = set()
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        folder = Path(_lock_dir())
        assert folder.parent == run and folder.name == worker
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # ensure_lock_dir refuses wider
        folders.add(folder)
    assert len(folders) == 2


@pytest.mark.slow  # two pytest-xdist workers collecting a module: out of the quick tier
def test_tests_sharing_a_module_fixture_run_on_one_worker() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNUSED_PLUGINS, "-v",
         "-n", "2", "--dist", "loadgroup", "tests/test_export_ray.py"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
    ran = re.findall(r"\[(gw\d+)\].* PASSED tests/test_export_ray\.py::(\S+)", out.stdout)
    # The three tests of the module-scoped `exported` carry its group; the others none.
    grouped = {(gw, name) for gw, name in ran if name.endswith("@tests/test_export_ray.py")}
    assert len(grouped) == 3 and len({gw for gw, _ in grouped}) == 1, out.stdout[-3000:]
    assert len(ran) > len(grouped), out.stdout[-3000:]


@dataclass(eq=False)
class _Item:
    """What the grouping reads of a collected test: its fixtures, and the marks it is given."""

    uses: dict[str, tuple[str, str]]  # fixture name -> (scope, where it is defined)
    marks: list[pytest.MarkDecorator] = field(default_factory=list)

    @property
    def _fixtureinfo(self) -> SimpleNamespace:
        defs = {n: [SimpleNamespace(scope=s, baseid=b)] for n, (s, b) in self.uses.items()}
        return SimpleNamespace(names_closure=list(self.uses), name2fixturedefs=defs)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark)

    def group(self) -> str | None:
        names = [m.args[0] for m in self.marks if m.name == "xdist_group"]
        assert len(names) <= 1
        return names[0] if names else None


def test_tests_linked_through_shared_fixtures_form_one_group_named_alike_in_any_order() -> None:
    """A test using its module's server and its folder's tritonserver joins the tests of
    either; fixtures of a test's own, or of pytest's (baseid ""), group nothing."""

    def items() -> list[_Item]:
        return [
            _Item({"exported": ("module", "tests/triton/test_t.py")}),
            _Item(
                {
                    "exported": ("module", "tests/triton/test_t.py"),
                    "local": ("session", "tests/triton"),
                }
            ),
            _Item({"local": ("session", "tests/triton")}),
            _Item({"cluster": ("module", "tests/ray")}),
            _Item({"tmp_path_factory": ("session", ""), "project": ("function", "tests")}),
        ]

    for order in (slice(None), slice(None, None, -1)):
        made = items()
        _group_by_shared_fixtures(made[order])  # type: ignore[arg-type]
        assert [i.group() for i in made] == [
            "tests/triton", "tests/triton", "tests/triton", "tests/ray", None,
        ]  # fmt: skip

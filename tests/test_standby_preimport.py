"""A fresh standby imports the serving version's libraries ahead of its first build.

A Hugging Face model's first push or reload in a new standby spent seconds importing
transformers (benchmarks/train_eval_hf.py: 11 s under a trainer on 2 cores). The worker
reports the installed modules a build imported (`LoadReply.libraries`); the next standby
imports them at idle priority while it waits (worker/__main__.py).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from hotreload.worker import imported_files


def installed_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of a site-packages folder of the test's own (on sys.path), never imported."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    name = f"hr_probe_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(folder))
    return name


def test_the_libraries_a_build_imported_are_listed_in_import_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = installed_module(tmp_path, monkeypatch)
    # "Since the worker started" is now: in a test process, whatever other tests imported
    # before (textual, transformers, ...) would otherwise fill the list past its size bound.
    monkeypatch.setattr(imported_files, "_AT_START", frozenset(sys.modules))
    before = imported_files.libraries()
    importlib.import_module(name)
    after = imported_files.libraries()
    assert name in after and name not in before
    assert all(n not in imported_files._AT_START for n in after)
    assert "json" not in after and "torch" not in after  # the standard library, the start's


def test_a_standby_boot_imports_them_at_low_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = installed_module(tmp_path, monkeypatch)
    code = textwrap.dedent(
        f"""
        import sys
        from hotreload.worker.__main__ import _import_at_low_priority
        _import_at_low_priority(19, [{name!r}, "no_such_module_here"])
        print({name!r} in sys.modules, "no_such_module_here" in sys.modules)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    assert out.stdout.split() == ["True", "False"], out

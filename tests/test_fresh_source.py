"""User code is compiled from its source: an edit that a cached .pyc would hide still loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

#: Imports `mod`, rewrites it with the same length and the same mtime (an edit saved within
#: the same second), imports it again and prints both values.
SCRIPT = """
import importlib, os, pathlib, sys
sys.path.insert(0, {code!r})
if {fresh!r}:
    from hotreload.worker.fresh_source import compile_from_source
    compile_from_source([pathlib.Path({code!r})])
mod = pathlib.Path({code!r}, "mod.py")
import mod as first
stamp = os.stat(mod).st_mtime_ns
mod.write_text(mod.read_text().replace("1.0", "2.0"))
os.utime(mod, ns=(stamp, stamp))
del sys.modules["mod"]
importlib.invalidate_caches()
import mod as second
print(first.V, second.V, sorted(os.listdir({cache!r})) if os.path.isdir({cache!r}) else [])
"""


def run(tmp_path: Path, *, fresh: bool) -> list[str]:
    code = tmp_path / ("fresh" if fresh else "plain")
    code.mkdir()
    (code / "mod.py").write_text("V = 1.0\n")
    script = SCRIPT.format(code=str(code), fresh=fresh, cache=str(code / "__pycache__"))
    # Bytecode caching on, as on a user's machine (this CI may switch it off).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(maxsplit=2)


def test_plain_imports_load_the_stale_pyc_which_is_the_bug_being_fixed(tmp_path: Path) -> None:
    first, second, cached = run(tmp_path, fresh=False)
    if second != "1.0":
        pytest.skip("this Python re-validates .pyc files by content: no stale import here")
    assert first == "1.0" and "mod" in cached


def test_modules_in_the_code_folders_compile_from_source(tmp_path: Path) -> None:
    first, second, cached = run(tmp_path, fresh=True)
    assert (first, second) == ("1.0", "2.0")
    assert cached == "[]"  # and no .pyc is written for them


def test_modules_outside_the_code_folders_keep_the_normal_import(tmp_path: Path) -> None:
    from hotreload.worker.fresh_source import UserCodeFinder

    finder = UserCodeFinder()
    finder.set_roots([tmp_path])
    (tmp_path / "inside.py").write_text("")
    spec = finder.find_spec("inside", [str(tmp_path)])
    assert spec is not None and type(spec.loader).__name__ == "SourceOnlyLoader"
    assert finder.find_spec("json", None) is None  # the stdlib is found by the usual finders
    assert finder.find_spec("missing_module_xyz", [str(tmp_path)]) is None


ORDER_SCRIPT = """
import importlib.machinery, pathlib, sys
code = pathlib.Path({code!r})
sys.path.insert(0, str(code))
sys.path.insert(0, str(code / "venv" / "site-packages"))
from hotreload.worker.fresh_source import SourceOnlyLoader, compile_from_source, _finder
compile_from_source([code])
meta = sys.meta_path
assert meta.index(importlib.machinery.BuiltinImporter) < meta.index(_finder)
assert meta.index(_finder) < meta.index(importlib.machinery.PathFinder)
import itertools  # a built-in module, shadowed by nothing
assert not hasattr(itertools, "SHADOW"), "a file in the code folder replaced a built-in"
import installed_pkg, mine
assert type(installed_pkg.__spec__.loader) is importlib.machinery.SourceFileLoader
assert type(mine.__spec__.loader) is SourceOnlyLoader
import pkg.sub
assert type(pkg.sub.__spec__.loader) is SourceOnlyLoader and pkg.sub.VALUE == 2
print("ok")
"""


def test_built_ins_and_installed_packages_keep_the_usual_import(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "venv" / "site-packages").mkdir(parents=True)
    (code / "itertools.py").write_text("SHADOW = True\n")
    (code / "venv" / "site-packages" / "installed_pkg.py").write_text("")
    (code / "mine.py").write_text("")
    (code / "pkg").mkdir()
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "sub.py").write_text("from . import helper\nVALUE = helper.ONE + 1\n")
    (code / "pkg" / "helper.py").write_text("ONE = 1\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", ORDER_SCRIPT.format(code=str(code))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

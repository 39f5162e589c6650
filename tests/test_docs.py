"""The README and the docs site say what the code does: the generated configuration page is
the code's, the README's model and commands run, its links lead somewhere.

`scripts/test.sh` also builds the site with `mkdocs build --strict` (broken links, pages
missing from nav); these tests check what a build cannot.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hotreload.config import models
from hotreload.config.reference import field_comments, render_reference
from tests.support import REPO, ServeProcess

README = REPO / "README.md"
DOCS = REPO / "docs"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_configuration_page_is_what_the_generator_writes() -> None:
    committed = (DOCS / "configuration.md").read_text()
    assert committed == render_reference(), (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/python -m hotreload.config.reference docs/configuration.md`"
    )


def test_every_model_key_has_a_description_in_the_reference() -> None:
    comments = field_comments(models.ModelConfig)
    assert set(models.MODEL_KEYS) <= set(comments)
    page = render_reference()
    for key in models.MODEL_KEYS:
        assert f"| `{key}` |" in page


def test_readme_is_a_front_door_and_its_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"
    # The two set-up commands, and .ci/run calls the second.
    assert "./scripts/demo.sh" in text and "./scripts/test.sh" in text
    assert "exec ./scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_readme_minimal_model_passes_check(tmp_path: Path) -> None:
    """The README's model.py and hotreload.toml, as shown, through `hotreload check`."""
    text = README.read_text()
    model = next(b for b in _blocks(text, "python") if b.startswith("# model.py"))
    toml = next(b for b in _blocks(text, "toml") if b.startswith("# hotreload.toml"))
    (tmp_path / "model.py").write_text(model)
    (tmp_path / "hotreload.toml").write_text(toml)
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "check", "--reloads", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # What the README's shown output claims.
    assert "tiny on cpu (availability, inplace)" in out.stdout
    assert "outputs finite: output float32[1, 2]" in out.stdout
    assert "hotreload check: PASS" in out.stdout


def _bootstrapped() -> bool:
    """demo.sh runs bootstrap.sh first; only where it has nothing to install (as after
    scripts/test.sh) may a test run it, or it would spend a minute in pip."""
    check = [str(REPO / "scripts" / "bootstrap.sh"), "--check", "demo"]
    return subprocess.run(check, capture_output=True, timeout=60).returncode == 0


class _Demo(ServeProcess):
    """`./scripts/demo.sh --no-tui` as the README shows it (plain lines: no terminal), with
    its copy of the example in `work` (HOTRELOAD_DEMO_DIR) instead of the clone's demo/."""

    def __init__(self, work: Path) -> None:
        self.config = work / "mlp" / "hotreload.toml"
        self.proc = subprocess.Popen(
            ["./scripts/demo.sh", "--no-tui"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", HOTRELOAD_DEMO_DIR=str(work)),
            start_new_session=True,
        )
        import threading

        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and ".hotreload" not in p.parts
    }


def test_getting_started_commands_run_against_the_demo(tmp_path: Path) -> None:
    """The demo, then the commands the getting-started page runs beside it (new weights
    included); the example the repository tracks stays as it was."""
    if not _bootstrapped():
        pytest.skip("scripts/bootstrap.sh would install first (run scripts/test.sh)")
    venv = REPO / ".venv" / "bin"
    page = (DOCS / "getting-started.md").read_text()
    shown = [
        line.split("#")[0].split()
        for block in _blocks(page, "sh")
        for line in block.splitlines()
        if line.startswith(".venv/bin/") and "demo/mlp" in line
    ]
    shown += [
        cmd.split()
        for cmd in re.findall(r"`(\.venv/bin/python demo/mlp/make_weights\.py[^`]*)`", page)
    ]
    assert len(shown) == 4, shown
    # The page's paths, pointed at this test's copy of the example.
    shown = [[w.replace("demo/mlp", str(tmp_path / "mlp")) for w in cmd] for cmd in shown]
    status = [str(venv / "hotreload"), "status", "--config", str(tmp_path / "mlp")]
    if subprocess.run(status, cwd=REPO, capture_output=True, timeout=60).returncode == 0:
        pytest.skip("a session already serves the demo copy (a demo running here?)")
    before = _digests(REPO / "examples")
    demo = _Demo(tmp_path)
    try:
        demo.wait_ready(timeout=90)
        assert f"demo: copied examples/mlp to {tmp_path / 'mlp'}/" in demo.output
        for cmd in shown:
            out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90)
            assert out.returncode == 0, f"{cmd}: {out.stdout}{out.stderr}"
            if "client.py" in cmd[1]:
                assert out.stdout.startswith("v1 ")
            if "make_weights.py" in cmd[1]:
                assert str(tmp_path / "mlp" / "weights.safetensors") in out.stdout
    finally:
        demo.close()
    # New weights went to the copy; nothing under examples/ changed.
    assert _digests(REPO / "examples") == before
    assert _digests(tmp_path / "mlp")["weights.safetensors"] != before["mlp/weights.safetensors"]


def test_docs_pages_send_readers_to_pages_not_to_the_readme() -> None:
    """The site is built from docs/ alone: a page that points at "the README" for something
    sends its reader off the site, often to a section that has moved (or never was)."""
    for page in sorted(DOCS.glob("*.md")):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert "README" not in line, (
                f"docs/{page.name}:{n} points to the README; link the docs page instead: {line}"
            )


def test_the_built_site_reads_from_disk(tmp_path: Path) -> None:
    """`mkdocs build` into a folder, then every relative link and picture of every page
    leads to a file there: opened from disk (file://), a link to `page/` showed a directory
    listing. The pictures are SVG a browser can parse."""
    pytest.importorskip("mkdocs", reason="the docs tools come with requirements-ci.txt")
    from xml.dom import minidom

    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
    out = subprocess.run(
        [*build, "-f", str(REPO / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    checked = 0
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # served from any path: its links are absolute
            continue
        for url in re.findall(r'\s(?:href|src)="([^"#:]+)(?:#[^"]*)?"', page.read_text()):
            target = (page.parent / url).resolve()
            where = f"{page.relative_to(site)} links to {url}"
            assert target.is_file(), f"{where}: {'a folder' if target.is_dir() else 'nothing'}"
            if target.suffix == ".svg":
                minidom.parse(str(target))
            checked += 1
    assert checked > 100  # the pages, their assets and the pictures were all seen

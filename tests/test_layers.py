"""One-way layers: the manager side never loads torch, textual or pynvml."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "pynvml")


@pytest.mark.parametrize(
    "modules",
    [
        "hotreload.engine.session, hotreload.commands.serve, hotreload.engine.model",
        "hotreload.engine.router, hotreload.engine.endpoint, hotreload.engine.worker_proc",
        "hotreload.client, hotreload.cli, hotreload.commands.status, hotreload.commands.reload",
        "hotreload.session_call, hotreload.commands.check, hotreload.engine.model.respawn",
        "hotreload.engine.checkpoint_ready",
        "hotreload.engine.model.recovery, hotreload.engine.watcher, hotreload.commands.watch",
        "hotreload, hotreload.config, hotreload.protocol, hotreload.runtime",
        "hotreload.commands.dashboard_ops, hotreload.commands.watch_dashboard",
        "hotreload.commands.dashboard, hotreload.protocol.frame_protocol",
        "hotreload.export.triton, hotreload.export.local_triton, hotreload.export.bundle",
        "hotreload.export.ray, hotreload.export.ray_options",
    ],
)
def test_manager_side_imports_no_heavy_module(modules: str) -> None:
    code = (
        f"import sys, {modules}\n"
        "from hotreload.cli import build_parser; build_parser()\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{modules} pulled in: {out.stdout.strip()}"


def test_only_the_worker_imports_torch_at_module_level() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "hotreload"
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if (
                stripped.startswith(("import torch", "from torch"))
                and not line.startswith(" ")
                and not rel.startswith("worker/")
            ):
                offenders.append(rel)
            if stripped.startswith(("import textual", "from textual")) and not rel.startswith(
                "tui/"
            ):
                offenders.append(rel)
            if stripped.startswith(("import pynvml", "from pynvml")) and not rel.startswith("gpu/"):
                offenders.append(rel)
    assert offenders == []


def test_the_only_x_imports_y_contracts_name_every_module() -> None:
    """The "only hotreload.worker imports torch" contracts (pyproject.toml, checked by
    `lint-imports`) list every other module by name: a new module must join those lists."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    children = {
        f"hotreload.{p.stem}"
        for p in (repo / "hotreload").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    contracts = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    allowed = {"torch": "hotreload.worker", "pynvml": "hotreload.gpu", "textual": "hotreload.tui"}
    checked = set()
    for contract in contracts:
        forbidden = contract.get("forbidden_modules", [])
        if contract["type"] == "forbidden" and forbidden[0] in allowed:
            owner = allowed[forbidden[0]]
            missing = children - {owner} - set(contract["source_modules"])
            assert missing == set(), f"{contract['name']}: add {sorted(missing)}"
            assert owner not in contract["source_modules"]
            checked.add(forbidden[0])
    assert checked == set(allowed)

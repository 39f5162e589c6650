"""The model's state record has one writer: the supervisor (engine/model/supervisor.py).

Phases, strategies, recovery and every reader outside engine/model/ change it only through
the supervisor's state-change methods, so one place says how a model's state can move.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hotreload"
WRITER = PACKAGE / "engine" / "model" / "supervisor.py"


def _record_writes(tree: ast.AST) -> list[int]:
    """Lines assigning to `<x>.record.<attr>`, or to `rec.<attr>` where `rec` was bound to
    some `<x>.record`."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign) and getattr(value, "attr", None) == "record":
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(t, ast.Attribute):
                    continue
                base = t.value
                if (isinstance(base, ast.Attribute) and base.attr == "record") or (
                    isinstance(base, ast.Name) and base.id in aliases
                ):
                    lines.append(t.lineno)
    return lines


def test_only_the_supervisor_writes_a_models_record() -> None:
    writers = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != WRITER and (lines := _record_writes(ast.parse(path.read_text())))
    }
    assert writers == {}, f"write the record through ModelSupervisor's methods: {writers}"
    assert _record_writes(ast.parse(WRITER.read_text())), "the check finds the real writer"


def test_the_check_sees_a_write_through_an_alias() -> None:
    code = "def f(sup):\n    rec = sup.record\n    rec.state = 'x'\n    sup.record.restarts += 1\n"
    assert _record_writes(ast.parse(code)) == [3, 4]

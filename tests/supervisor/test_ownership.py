"""A model's state has one writer: engine/model/state.py.

Its record (which worker serves, which version, the state shown, the standby, the history)
and its router's admission (the gate, the worker requests go to, what a refused request is
told) change only through `ModelState`'s methods. The supervisor decides; phases,
strategies, recovery and every reader outside engine/model/ ask it, so one page says how a
model's state can move.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hotreload"
WRITER = PACKAGE / "engine" / "model" / "state.py"
#: The router's own module changes its own fields, of course.
ROUTER = PACKAGE / "engine" / "router.py"
#: ModelRouter methods that change what it admits or where requests go.
ROUTER_MUTATORS = frozenset(
    {
        "open_gate",
        "close_gate",
        "handover",
        "fail_queued",
        "refuse_until_reload",
        "serving_version",
    }
)
#: ModelRouter fields that say where requests go and what they are checked against.
ROUTER_FIELDS = frozenset(
    {"worker", "unavailable_reason", "input_form", "input_signature", "latency", "queue_latency"}
)


def _aliases(tree: ast.AST, attr: str) -> set[str]:
    """Names bound to `<x>.<attr>` (`rec = sup.record`, `router = self.router`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = []
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(target.elts, node.value.elts, strict=False))
                else:
                    pairs.append((target, node.value))
            for t, v in pairs:
                if isinstance(t, ast.Name) and getattr(v, "attr", None) == attr:
                    names.add(t.id)
    return names


def _is(base: ast.expr, attr: str, aliases: set[str]) -> bool:
    return (isinstance(base, ast.Attribute) and base.attr == attr) or (
        isinstance(base, ast.Name) and base.id in aliases
    )


def _state_writes(tree: ast.AST) -> list[int]:
    """Lines assigning to a field of `<x>.record` or `<x>.router` (or an alias of one),
    and calls of the router's admission methods."""
    records, routers = _aliases(tree, "record"), _aliases(tree, "router")
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ROUTER_MUTATORS
            and _is(node.func.value, "router", routers)
        ):
            lines.append(node.lineno)
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(t, ast.Attribute):
                    continue
                if _is(t.value, "record", records) or (
                    t.attr in ROUTER_FIELDS and _is(t.value, "router", routers)
                ):
                    lines.append(t.lineno)
    return sorted(lines)


def test_only_the_model_state_writes_a_models_record_and_router() -> None:
    writers = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in (WRITER, ROUTER) and (lines := _state_writes(ast.parse(path.read_text())))
    }
    assert writers == {}, f"change a model's state through ModelState's methods: {writers}"
    assert _state_writes(ast.parse(WRITER.read_text())), "the check finds the real writer"


def test_the_check_sees_writes_through_aliases_and_router_calls() -> None:
    code = (
        "def f(sup):\n"
        "    rec = sup.record\n"
        "    rec.state = 'x'\n"
        "    sup.record.restarts += 1\n"
        "    router = sup.router\n"
        "    router.close_gate()\n"
        "    sup.router.worker = None\n"
        "    sup.router.inflight\n"
    )
    assert _state_writes(ast.parse(code)) == [3, 4, 6, 7]

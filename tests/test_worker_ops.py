"""`WorkerOp` (protocol/ops.py): the op names the engine sends and the worker routes, once."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from hotreload.config import load_config
from hotreload.engine.worker_proc import WorkerProcess
from hotreload.protocol.ops import WorkerOp
from tests.support import make_project

PACKAGE = Path(__file__).resolve().parent.parent / "hotreload"


def _ops_named_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "WorkerOp"
    }


def test_the_worker_routes_every_op() -> None:
    assert _ops_named_in(PACKAGE / "worker" / "server.py") == set(WorkerOp.__members__)


def test_the_engine_names_no_op_as_a_string() -> None:
    wire_names = {op.value for op in WorkerOp}
    literal = []
    # The engine's own files and its model/ package (the supervisor, the phases), and the
    # check command, which asks workers too.
    for path in [*sorted((PACKAGE / "engine").rglob("*.py")), PACKAGE / "commands" / "check.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "request"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in wire_names
            ):
                literal.append(f"{path.name}:{node.lineno} {node.args[0].value!r}")
    assert literal == [], "use WorkerOp: " + ", ".join(literal)


def test_an_op_the_worker_lacks_fails_before_anything_is_sent(tmp_path: Path) -> None:
    config = load_config(make_project(tmp_path))
    worker = WorkerProcess(config.models[0], config, generation=1)

    async def ask() -> None:
        await worker.request("lod", 1.0)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="'lod' is not a valid WorkerOp"):
        asyncio.run(ask())


def test_an_op_travels_as_its_plain_string() -> None:
    from hotreload.protocol.framing import pack_frame, unpack_body

    (frame,) = pack_frame({"op": WorkerOp.SWAP, "id": 3})
    header = unpack_body(bytes(frame)[4:]).header
    assert header == {"op": "swap", "id": 3} and type(header["op"]) is str

"""Checks of a valid config against this machine and the model's files, made before any
start-up work (socket, HTTP, workers): a mistake found here exits 2 at once, naming the
config file, instead of after a worker took seconds to import torch and fail.

Only what can be known without importing the user's code: explicit `cpus` against this
process's CPUs, and that a file entry's module defines the name it points at (read with
`ast`, never executed). The worker checks the rest when it loads, with the same hints.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hotreload.config import Config, EntryPoint, ModelConfig
from hotreload.engine.cpus import SUPPORTED, available_cpus, cpus_problem
from hotreload.errors import ConfigError, did_you_mean

#: Calls through which a module can bind names a reader of its source cannot see.
_DYNAMIC = ("globals", "exec", "vars", "setattr", "locals")


def preflight(config: Config, models: list[ModelConfig] | None = None) -> None:
    """Raise ConfigError (with the config path) for the first problem found."""
    path = str(config.path)
    for m in models if models is not None else config.models:
        if SUPPORTED and isinstance(m.cpus, tuple):
            problem = cpus_problem(m, available_cpus())
            if problem:
                raise ConfigError(problem, path=path, key=f"models.{m.name}.cpus")
        for field, entry in (("entry", m.entry), ("example", m.example)):
            problem = missing_name(entry)
            if problem:
                raise ConfigError(problem, path=path, key=f"models.{m.name}.{field}")


def missing_name(entry: EntryPoint) -> str | None:
    """What is wrong when `entry.file` surely lacks `entry.attr`, else None (also when the
    module could bind it in ways a reader cannot see: `import *`, `__getattr__`, globals())."""
    if entry.file is None:
        return None  # a module name: finding its file means importing its packages
    first = entry.attr.split(".")[0]
    bound = _top_level_names(entry.file)
    if bound is None or first in bound:
        return None
    callables = sorted(n for n, is_callable in bound.items() if is_callable)
    listing = f" (it defines {', '.join(callables[:8])})" if callables else ""
    return (
        f"{entry.spec}: {entry.file.name} has no {first!r}{did_you_mean(first, callables)}{listing}"
    )


def _top_level_names(file: Path) -> dict[str, bool] | None:
    """Names the module binds at its top level -> whether surely callable (a def or a class);
    None when that cannot be told from the source."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (OSError, SyntaxError, ValueError):
        return None  # the worker reports it, with the traceback
    names: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in _DYNAMIC:
            return None
    for stmt in _top_level_statements(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[stmt.name] = True
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                if alias.name == "*":
                    return None
                names.setdefault(alias.asname or alias.name.split(".")[0], False)
        else:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.setdefault(node.id, False)
    return None if "__getattr__" in names else names


def _top_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements run at import: the body, and what sits inside its if/try/with/for blocks
    (not function or class bodies)."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            out.extend(_top_level_statements(getattr(stmt, field, None) or []))
        for block in [
            *(getattr(stmt, "handlers", None) or []),
            *(getattr(stmt, "cases", None) or []),
        ]:
            out.extend(_top_level_statements(block.body))
    return out

"""Which of a code folder's Python files the model imports, read from their `import` lines.

An export used to copy the entry's folder whole, so a client script beside `model.py` went
to Triton too, and its imports (`hotreload`, `requests`) were listed as requirements of
Triton's Python. The folder is still copied (data files the model opens come along), but
Python files that no import reaches from the entry and example files are left out.

Conservative where the source cannot say: a package the model imports is kept whole (its
modules may import each other dynamically), and a file that does not parse is kept.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def _module_file(base: Path, dotted: str) -> Path | None:
    """`pkg.mod` -> base/pkg/mod.py or base/pkg/mod/__init__.py, if it is there."""
    path = base.joinpath(*dotted.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def _imports(path: Path, base: Path) -> list[str] | None:
    """The dotted module names `path` imports that could be local (relative ones resolved
    against its own package); None when it does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return None
    here = path.relative_to(base).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        here = path.relative_to(base).parts[:-1]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                prefix = ".".join(anchor)
                mod = ".".join(p for p in (prefix, node.module or "") if p)
            else:
                mod = node.module or ""
            if mod:
                names.append(mod)
            # `from pkg import sub` may name a submodule.
            names += [f"{mod}.{a.name}" if mod else a.name for a in node.names]
    return names


def imported_files(base: Path, starts: Iterable[Path]) -> set[Path]:
    """Every .py file under `base` reachable by imports from `starts` (themselves included),
    with whole packages kept for any package reached."""
    base = base.resolve()
    seen: set[Path] = set()
    todo = [p.resolve() for p in starts if p.suffix == ".py"]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_relative_to(base):
            continue
        seen.add(path)
        names = _imports(path, base)
        if names is None:
            continue
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # pkg, pkg.sub, pkg.sub.mod: each __init__ runs
                found = _module_file(base, ".".join(parts[:i]))
                if found is not None and found not in seen:
                    todo.append(found)
    # A package reached: every module of it, since its own code may import them by name.
    for init in [p for p in seen if p.name == "__init__.py"]:
        seen.update(q.resolve() for q in init.parent.rglob("*.py"))
    return seen


def unimported_files(base: Path, starts: Iterable[Path]) -> list[Path]:
    """The .py files under `base` (relative to it) that no import from `starts` reaches."""
    keep = imported_files(base, starts)
    base = base.resolve()
    return sorted(
        p.relative_to(base)
        for p in base.rglob("*.py")
        if p.resolve() not in keep and "__pycache__" not in p.parts
    )

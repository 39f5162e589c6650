"""The worker's loading rules as one stand-alone module, for an exported model.

An exported Triton model must load and call the model exactly as hotreload does (entry
import, strict weights, example forms, output flattening), but must not need hotreload.
Rather than a second copy of those rules that would drift, the export takes the source of
the functions themselves from hotreload's files (parsed, never imported: the manager does
not import torch) with everything they use from hotreload, transitively, and writes them
into one module. Imports of other packages (torch, safetensors, the standard library) are
kept as they are.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
#: The names the exported model.py calls, by the module that defines them.
ROOTS: dict[str, tuple[str, ...]] = {
    "hotreload.worker.loader": (
        "resolve",
        "torchscript_factory",
        "call_model",
        "LoadError",
        "pick_device",
    ),
    "hotreload.worker.weights": ("load_weights",),
    "hotreload.worker.signatures": (
        "normalise_example",
        "normalise_output",
        "accepted_parameters",
        "parameter_problem",
        "entry_under",
        "dropped_note",
        "SignatureError",
        "FORM_SINGLE",
        "FORM_TUPLE",
        "FORM_DICT",
    ),
    "hotreload.worker.inputs": ("to_device",),
    "hotreload.protocol.text": ("as_rows", "is_text"),
}


class BundleError(Exception):
    """The rules use something that cannot be taken out of hotreload (a bug to fix here)."""


@dataclass
class _Module:
    name: str
    tree: ast.Module
    #: Top-level name -> the statement that binds it (def, class, assignment).
    defs: dict[str, ast.stmt] = field(default_factory=dict)
    #: Name -> (module, attribute or None) for top-level imports.
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: Name -> the `import a.b` lines that bind it (`importlib.machinery` needs its own).
    plain: dict[str, set[str]] = field(default_factory=dict)
    #: Name -> later top-level statements that change it in place (`TABLE[key] = value`).
    amends: dict[str, list[ast.stmt]] = field(default_factory=dict)


def _bound_names(target: ast.expr) -> list[str]:
    """The names an assignment target binds (`a`, `a, b`, `*rest`), not those it only
    indexes (`TABLE[key]` binds nothing: it changes TABLE)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound_names(e)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _amended_name(target: ast.expr) -> str | None:
    """`TABLE` for a target `TABLE[key]` or `TABLE.attr` (nested too)."""
    node = target
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) and node is not target else None


def _load(name: str) -> _Module:
    path = PACKAGE_ROOT.parent / (name.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mod = _Module(name, tree)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for bound in _bound_names(t):
                    mod.defs[bound] = node
                base = _amended_name(t)
                if base is not None:  # `TABLE[key] = ...`: part of TABLE's definition
                    mod.amends.setdefault(base, []).append(node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                mod.imports[bound] = (a.name.split(".")[0], None)
                line = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                mod.plain.setdefault(bound, set()).add(line)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                mod.imports[a.asname or a.name] = (node.module or "", a.name)
    return mod


def _used_names(node: ast.AST) -> tuple[set[str], set[str]]:
    """Names a statement reads at run time, and those only its annotations name (never
    evaluated: the module uses `from __future__ import annotations`)."""
    skip: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skip.update(id(a) for a in ast.walk(n.returns) if n.returns)
            for arg in [*n.args.args, *n.args.kwonlyargs, *n.args.posonlyargs]:
                if arg.annotation is not None:
                    skip.update(id(a) for a in ast.walk(arg.annotation))
        elif isinstance(n, ast.AnnAssign):
            skip.update(id(a) for a in ast.walk(n.annotation))
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    runtime = {n.id for n in names if id(n) not in skip}
    return runtime, {n.id for n in names if id(n) in skip} - runtime


def bundle_source(roots: dict[str, tuple[str, ...]] = ROOTS) -> str:
    """One module's source holding `roots` and all they need from hotreload."""
    modules: dict[str, _Module] = {}
    picked: dict[tuple[str, str], ast.stmt] = {}
    external: set[str] = set()
    #: Module -> the hotreload modules it takes names from (defined first in the bundle).
    deps: dict[str, set[str]] = {}
    #: (module, name, only named in annotations?)
    todo = [(m, n, False) for m, names in roots.items() for n in names]
    while todo:
        mod_name, name, typing_only = todo.pop()
        mod = modules.get(mod_name) or modules.setdefault(mod_name, _load(mod_name))
        if name in mod.defs and not typing_only:
            stmt = mod.defs[name]
            if any(s is stmt for s in picked.values()):
                continue
            picked[(mod_name, name)] = stmt
            runtime, typing = _used_names(stmt)
            todo += [(mod_name, n, False) for n in runtime if n != name]
            todo += [(mod_name, n, True) for n in typing]
            for i, extra in enumerate(mod.amends.get(name, ())):
                picked[(mod_name, f"{name} (amended {i})")] = extra
                todo += [(mod_name, n, False) for n in _used_names(extra)[0] if n != name]
        elif name in mod.imports:
            source, attr = mod.imports[name]
            if source.startswith("hotreload"):
                if not typing_only:
                    deps.setdefault(mod_name, set()).add(source)
                    todo.append((source, attr or name, False))
            elif attr is None:
                external.update(mod.plain[name])
            else:
                external.add(_import_line(name, source, attr))
        # else a builtin or a local name: nothing to take
    _check_unique(picked)
    _check_no_hotreload_imports(picked.values())
    # Definitions in their files' order, files in dependency order: a module's names come
    # before those of the modules that import them (module-level code such as a table
    # that names another module's constant runs in that order).
    order = {m: i for i, m in enumerate(_dependency_order(list(modules), deps))}
    body = sorted(
        {id(s): (m, s) for (m, _), s in picked.items()}.values(),
        key=lambda ms: (order[ms[0]], ms[1].lineno),
    )
    header = [
        '"""hotreload\'s loading rules, taken from its source by `hotreload export`.',
        "",
        "Generated: do not edit; re-run the export instead.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *sorted(external),
        "",
    ]
    parts = [
        _with_decorators(ast.get_source_segment(_source_of(modules[m]), s) or "", s)
        for m, s in body
    ]
    return "\n".join(header) + "\n\n" + "\n\n\n".join(parts) + "\n"


def _dependency_order(names: list[str], deps: dict[str, set[str]]) -> list[str]:
    """`names` with every module after the modules it imports from (depth first; the
    package's modules import each other without cycles, which lint-imports checks)."""
    out: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep in sorted(deps.get(name, ())):
            if dep in names:
                visit(dep)
        out.append(name)

    for name in names:
        visit(name)
    return out


def _source_of(mod: _Module) -> str:
    path = PACKAGE_ROOT.parent / (mod.name.replace(".", "/") + ".py")
    return path.read_text(encoding="utf-8")


def _with_decorators(text: str, stmt: ast.stmt) -> str:
    decorators = getattr(stmt, "decorator_list", [])
    return "".join(f"@{ast.unparse(d)}\n" for d in decorators) + text


def _import_line(name: str, source: str, attr: str) -> str:
    return f"from {source} import {attr}" + (f" as {name}" if name != attr else "")


def _check_unique(picked: dict[tuple[str, str], ast.stmt]) -> None:
    seen: dict[str, str] = {}
    for mod_name, name in picked:
        if name in seen and seen[name] != mod_name:
            raise BundleError(f"{name!r} is defined in both {seen[name]} and {mod_name}")
        seen[name] = mod_name


def _check_no_hotreload_imports(stmts: Iterable[ast.stmt]) -> None:
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("hotreload"):
                raise BundleError(f"a bundled function imports {n.module} at line {n.lineno}")
            if isinstance(n, ast.Import) and any(a.name.startswith("hotreload") for a in n.names):
                raise BundleError(f"a bundled function imports hotreload at line {n.lineno}")

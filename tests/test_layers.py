"""The layers of the code base, read from the import statements of every module (no import runs).

- ``engine`` is a library: it imports nothing of ``webapp`` or ``workers``, anywhere, not even
  inside a function.
- Its foundations (``engine.algorithms``, ``engine.config``, ``engine.data``) import nothing of
  ``engine.trainer`` or ``engine.distributed``.
- The modules' top-level imports form no cycle (a cycle makes the import order matter and
  half-initialised modules appear); imports inside functions are the way to defer a heavy or
  optional dependency, and are not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "workers", "webapp")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path)] = path
    return found


def imports(path: Path, *, top_level_only: bool) -> Iterator[tuple[str, int]]:
    """Yield (imported module, line) for each import in the file (resolving relative ones)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b`` names module a.b when there is one, else a name in a.
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """Return the project module ``name`` refers to (a module, or the package it is in)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_the_engine_imports_nothing_of_the_web_app_or_the_workers():
    known = modules()
    offences = [
        f"{module}:{line} imports {target}"
        for module, path in known.items()
        if module.split(".")[0] == "engine"
        for target, line in imports(path, top_level_only=False)
        if target.split(".")[0] in ("webapp", "workers")
    ]
    assert offences == []


def test_the_foundations_import_nothing_of_the_trainer_or_the_distributed_layer():
    known = modules()
    foundations = ("engine.algorithms", "engine.config", "engine.data")
    above = ("engine.trainer", "engine.distributed")
    offences = [
        f"{module}:{line} imports {target}"
        for module, path in known.items()
        if module.startswith(foundations)
        for target, line in imports(path, top_level_only=False)
        if target.startswith(above)
    ]
    assert offences == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_top_level_imports_form_no_cycle():
    known = modules()
    graph = {
        module: {
            target
            for name, _ in imports(path, top_level_only=True)
            if (target := resolve(name, known)) and target != module
        }
        for module, path in known.items()
    }
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The import graph of first-party packages, read from source with :mod:`ast` (nothing is imported).

An edge ``a -> b`` means module ``a`` names module ``b`` in an ``import`` statement anywhere in its
source: at module level, inside ``if TYPE_CHECKING:``, or inside a function. All three count:

- a function-level import runs the first time the function does, so a cycle through it is a cycle
  that only shows up later (and a lazy import that exists only to dodge a cycle hides one);
- a ``TYPE_CHECKING`` import never runs, but the module still depends on the other one's types:
  two modules that name each other's types are one unit split in two, which is what the rule
  against cycles is about.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
Importing a submodule also runs its parent packages' ``__init__``; those implicit edges are left
out (a package's ``__init__`` re-exporting its modules is not a cycle of theirs).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` (folders under ``root``) by dotted name; a package by its
    ``__init__``'s."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_modules(path: Path, module: str, modules: Collection[str]) -> set[str]:
    """The modules of ``modules`` that ``module`` (its source at ``path``) imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute_module(node.module, node.level, module, is_package)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return (found & set(modules)) - {module}


def absolute_module(target: str | None, level: int, module: str, is_package: bool) -> str:
    """The absolute name of a ``from`` import's module (``level`` dots before ``target``)."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, target] if target else anchor)


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (see the module docstring for what counts)."""
    modules = module_files(root, packages)
    return {module: imported_modules(path, module, modules) for module, path in modules.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted; the list sorted):
    every module of one can reach every other, so each is at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit on deep graphs)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def one_cycle(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import cycle through the first module of ``component``: ``[a, b, ..., a]``."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise ValueError(f"{component} is not a cycle")

"""The import graph of the `rapid_llm` package, read from the source with `ast` (nothing is imported).

`import_graph(root)` maps each module ("rapid_llm.ops.registry"; a package is its `__init__`) to the package
modules it imports anywhere in its file, function bodies included, with the line of the first import;
imports under `if TYPE_CHECKING:` are left out (they never run). `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg`; importing `a.b.c` also runs `a` and `a.b`, so those packages
are edges too (except the importer's own). `faces(root)`: packages whose `__init__` defines nothing (imports,
assignments, a docstring). `cycles(graph)` lists the strongly connected components of more than one module
(Tarjan's algorithm, iterative). Used by test_layering.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

Graph = dict[str, dict[str, int]]  # module -> {imported module: line}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of the package at `root` (a directory with __init__.py)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return hidden


def _imported(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names]
    return [target for target in targets if target in modules]


def import_graph(root: Path) -> Graph:
    names = module_names(root)
    graph: Graph = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        hidden = _type_checking_nodes(tree)
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in hidden:
                for target in _imported(node, package, set(names)):
                    for run in _with_parent_packages(target):
                        if run in names and run != name and not name.startswith(run + "."):
                            edges.setdefault(run, node.lineno)
        graph[name] = edges
    return graph


def _with_parent_packages(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def faces(root: Path) -> set[str]:
    """Packages whose `__init__` only hands names on: no function or class of its own."""
    found = set()
    for name, path in module_names(root).items():
        if path.name == "__init__.py":
            body = ast.parse(path.read_text(), str(path)).body
            if not any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in body):
                found.add(name)
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """The import cycles: each strongly connected component of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
    return sorted(found)

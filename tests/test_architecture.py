"""The layering docs/architecture.md promises: the lower packages import none of their users, and no
module imports another that imports it back at import time."""

from __future__ import annotations

import ast
from pathlib import Path

import workbench

PACKAGE = Path(workbench.__file__).parent
LOWER = ("wire", "schema", "decode", "store", "protocol")
USERS = ("workbench.capture", "workbench.ingest", "workbench.client", "workbench.sim", "workbench.proxy",
         "workbench.tui", "workbench.fixtures", "workbench.analysis", "workbench.cli", "workbench.commands",
         "mitmproxy", "textual")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "/schema/proto/" in path.as_posix():
            continue
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _all_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _import_time_edges(path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules this one imports when it is imported: top-level statements only (an import inside a
    function runs later), and ``from pkg import mod`` depends on ``pkg.mod``."""
    edges: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            targets = subs if len(subs) == len(node.names) else [node.module, *subs]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                edges.add(target)
    return edges


def test_lower_packages_import_none_of_their_users() -> None:
    modules = _modules()
    lower = {n: p for n, p in modules.items() if n.split(".")[1:2] and n.split(".")[1] in LOWER}
    assert len(lower) > 20
    offending = sorted((name, imported) for name, path in lower.items() for imported in _all_imports(path)
                       if any(imported == u or imported.startswith(u + ".") for u in USERS))
    assert offending == []


def test_no_import_cycle_at_import_time() -> None:
    modules = _modules()
    graph = {name: _import_time_edges(path, modules) - {name} for name, path in modules.items()}
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert sum(len(edges) for edges in graph.values()) > 100
    assert cycles == []

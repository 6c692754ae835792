"""The layering docs/architecture.md promises: the lower packages import none of their users, and no
module imports another that imports it back: not at import time, not inside a function, not under
``TYPE_CHECKING`` (a back-reference hidden in any of those still ties the two modules together)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import workbench

PACKAGE = Path(workbench.__file__).parent
LOWER = ("wire", "schema", "decode", "store", "protocol")
USERS = ("workbench.capture", "workbench.ingest", "workbench.client", "workbench.sim", "workbench.proxy",
         "workbench.tui", "workbench.fixtures", "workbench.analysis", "workbench.cli", "workbench.commands",
         "mitmproxy", "textual")


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        if "/schema/proto/" in path.as_posix():
            continue
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
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


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> Iterator[str]:
    """The modules one import statement names: ``from pkg import mod`` names ``pkg.mod``, a relative
    import is resolved against the importing module, anything else is its nearest known module."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
        targets = subs if len(subs) == len(node.names) else [base, *subs]
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            yield target


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the modules it imports, counting every import statement wherever it sits: at the
    top, inside a function (deferred), under ``if TYPE_CHECKING``."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {target for node in ast.walk(ast.parse(path.read_text(), str(path)))
                       if isinstance(node, ast.Import | ast.ImportFrom)
                       for target in _imported(name, path, node, modules)}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    cycles: list[frozenset[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def _under_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def deferred_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside a function or class body (not those under ``if TYPE_CHECKING``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _under_type_checking(child):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                if inside:
                    found.append(child)
            else:
                walk(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))

    walk(tree, False)
    return found


def imports_without_a_reason(path: Path) -> list[int]:
    """Lines of imports inside functions with no comment saying why: on the statement's own line, or
    on the line above the block of imports it belongs to."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    import_lines = {line for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                    for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    missing = []
    for node in deferred_imports(tree):
        own = lines[node.lineno - 1:node.end_lineno]
        above = node.lineno - 1  # 1-based number of the line above
        while above in import_lines:
            above -= 1
        if not any("#" in line for line in own) and not lines[above - 1].strip().startswith("#"):
            missing.append(node.lineno)
    return missing


def test_every_import_inside_a_function_says_why() -> None:
    missing = [f"{name}:{line}" for name, path in sorted(_modules().items())
               for line in imports_without_a_reason(path)]
    assert missing == []


def test_the_reason_checker_sees_a_bare_deferred_import(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    import json\n"
                    "def f():\n    import duckdb  # heavy\n"
                    "def g():\n    # heavy, both\n    import duckdb\n    from pyarrow import (\n        Table,\n    )\n"
                    "    import pyarrow.compute\n"
                    "def h():\n    x = 1\n    import os\n")
    assert imports_without_a_reason(path) == [15]


def test_lower_packages_import_none_of_their_users() -> None:
    modules = _modules()
    lower = {n: p for n, p in modules.items() if n.split(".")[1:2] and n.split(".")[1] in LOWER}
    assert len(lower) > 20
    offending = sorted((name, imported) for name, path in lower.items() for imported in _all_imports(path)
                       if any(imported == u or imported.startswith(u + ".") for u in USERS))
    assert offending == []


def test_no_import_cycle_counting_deferred_and_type_checking_imports() -> None:
    graph = import_graph(_modules())
    assert sum(len(edges) for edges in graph.values()) > 100
    cycles = [sorted(c) for c in import_cycles(graph)]
    assert cycles == []


def _package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _modules(root / "pkg")


def test_the_checker_sees_a_cycle_through_a_deferred_import(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def late():\n    from .. import a\n    return a\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n",
        "d.py": "from . import c\n",
        "e.py": "import pkg.a\n",
    })
    assert sorted(sorted(c) for c in import_cycles(import_graph(modules))) == [
        ["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]


def test_the_checker_passes_a_package_without_cycles(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "", "a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import c\n", "c.py": "",
    })
    assert import_graph(modules)["pkg.b"] == {"pkg.c"}
    assert import_cycles(import_graph(modules)) == []

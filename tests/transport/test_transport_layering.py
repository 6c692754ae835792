"""``workbench.transport`` serves the simulator, the replay server and the proxy; it imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import workbench.transport

FORBIDDEN = ("workbench.sim", "workbench.fixtures", "workbench.proxy", "workbench.client", "workbench.tui",
             "workbench.cli")


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_transport_imports_no_user_of_it() -> None:
    package = Path(workbench.transport.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5
    offending = [(p.name, m) for p in modules for m in _imports(p)
                 if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert offending == []

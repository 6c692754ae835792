"""The TUI's modules form no import cycle, counting imports inside functions and under
TYPE_CHECKING (issue 22 item 3): screens get what they need from the application as a
``TuiContext`` and ask it for navigation with messages, so no screen imports the application."""

from __future__ import annotations

import ast
from pathlib import Path

import workbench.tui

TUI = Path(workbench.tui.__file__).parent


def _edges() -> dict[str, set[str]]:
    """tui module → the tui modules it names in any import statement, anywhere in the file."""
    mods = {p.stem for p in TUI.glob("*.py")}
    out: dict[str, set[str]] = {}
    for path in TUI.glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("workbench.tui."):
                    names.add(node.module.split(".")[2])
                elif node.module == "workbench.tui":
                    names.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.Import):
                names.update(a.name.split(".")[2] for a in node.names if a.name.startswith("workbench.tui."))
        out[path.stem] = names - {path.stem}
    return out


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_among_tui_modules() -> None:
    edges = _edges()
    assert "app" not in edges["session_screen"] and "app" not in edges["sessions_screen"]
    assert _cycle(edges) is None, " → ".join(_cycle(edges) or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]

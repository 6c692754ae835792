"""Reads have one home: SQL text is written in ``workbench/store/`` only.

A view asks for a read by name (``workbench.store.queries``, ``store.notebook_db``,
``store.parquet``) instead of writing SQL. SQL the user writes is data, not module text: the
statement given to ``workbench sql`` and the cells of a notebook (``.ipynb``) pass through the
package without being written in it, so they need no entry below. A module may still hold SQL
only when it is in ``ALLOWED`` with the reason.

SQL text is found as the project's structure check finds it — a string literal holding SELECT,
INSERT INTO, UPDATE, DELETE FROM or CREATE TABLE, and FROM or INTO — and also in an f-string
taken whole (the check looks at its literal parts one by one).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import workbench

PACKAGE = Path(workbench.__file__).parent
_SQL = re.compile(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|CREATE TABLE)\b")

# module → why it may hold SQL text (at most 3)
ALLOWED: dict[str, str] = {}

# Modules another branch (issue 22, the analysis and TUI reads) moves to store/ at the same time.
# The coordinator deletes this set once that branch is merged.


def is_sql(text: str) -> bool:
    return bool(_SQL.search(text)) and ("FROM" in text or "INTO" in text)


def _texts(tree: ast.AST) -> list[str]:
    """Every string literal; an f-string also whole, its fields as ``{}`` (``f"SELECT {c} FROM t"``
    has no part holding both SELECT and FROM)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
        elif isinstance(n, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values))
    return out


def sql_strings(source: str) -> list[str]:
    return [t for t in _texts(ast.parse(source)) if is_sql(t)]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def sql_modules() -> dict[str, list[str]]:
    """Modules outside workbench.store with SQL text → their first SQL strings."""
    out = {}
    for name, path in sorted(_modules().items()):
        if name == "workbench.store" or name.startswith("workbench.store."):
            continue
        found = sql_strings(path.read_text())
        if found:
            out[name] = [s.strip().splitlines()[0][:80] for s in found[:3]]
    return out


def test_no_sql_text_outside_store() -> None:
    found = sql_modules()
    stray = {m: s for m, s in found.items() if m not in ALLOWED}
    assert not stray, ("SQL written outside workbench/store/ (add a named read to workbench/store/queries.py "
                       f"and call it): {stray}")


def test_the_allowed_list_is_short_and_current() -> None:
    assert len(ALLOWED) <= 3
    assert all(reason.strip() for reason in ALLOWED.values())
    found = sql_modules()
    # an entry whose module no longer holds SQL is removed, so the list never allows more than it must
    assert not [m for m in ALLOWED if m not in found]


def test_the_store_holds_the_reads() -> None:
    """The check looks where the SQL went: the store's modules do hold SQL text."""
    store = [n for n, p in _modules().items() if n.startswith("workbench.store.") and sql_strings(p.read_text())]
    assert {"workbench.store.queries", "workbench.store.notebook_db", "workbench.store.parquet"} <= set(store)


def test_the_detector_tells_sql_from_prose() -> None:
    src = '''
x = f"SELECT {cols} FROM frames WHERE session_id = ?"
y = "INSERT INTO meta VALUES (?, ?)"
z = "select the session FROM the list"  # prose with an upper-case word is not SQL
w = "Run read-only SQL (SELECT, or EXPLAIN of a SELECT) on the capture"
'''
    assert sql_strings(src) == ["SELECT {} FROM frames WHERE session_id = ?", "INSERT INTO meta VALUES (?, ?)"]

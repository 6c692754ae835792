"""Where the capture database is when nobody says: one rule for the CLI, the TUI, the web UI,
the capture addon and notebooks.

1. ``--db PATH`` (commands) or the path passed to ``connect`` (notebooks);
2. else ``$WORKBENCH_DB``; a relative value that does not exist from the current directory is
   looked up in its parents too, so a notebook kernel started in ``notebooks/`` finds the same file
   as a shell in the repository root;
3. else ``workbench.duckdb`` in the nearest ``captures/`` folder, walking up from the current
   directory (the repository's ``captures/`` from any folder inside it);
4. else ``./captures/workbench.duckdb`` (created by the first capture).

The shipped notebooks analyse the demo: they ask for ``demo.duckdb`` by the same rule
(``default_db("demo.duckdb")``), which is what ``workbench demo`` writes.
"""

from __future__ import annotations

import os
from pathlib import Path

DB_ENV = "WORKBENCH_DB"
CAPTURES_DIR = "captures"
DEFAULT_DB_NAME = "workbench.duckdb"
DEMO_DB_NAME = "demo.duckdb"
RULE = (f"${DB_ENV}, else {CAPTURES_DIR}/{{name}} in the nearest {CAPTURES_DIR}/ folder from the "
        "current directory up")


def _here(start: str | Path | None) -> Path:
    return Path(start) if start is not None else Path.cwd()


def _display(path: Path, here: Path) -> str:
    """Relative to ``here`` when inside it (what a user typed), else absolute."""
    try:
        return str(path.relative_to(here))
    except ValueError:
        return str(path)


def nearest_captures_dir(start: str | Path | None = None) -> Path | None:
    """The nearest folder named ``captures`` in ``start`` (default: the current directory) or above."""
    here = _here(start).absolute()
    for folder in (here, *here.parents):
        candidate = folder / CAPTURES_DIR
        if candidate.is_dir():
            return candidate
    return None


def _from_env(value: str, here: Path) -> str:
    path = Path(value).expanduser()
    if path.is_absolute() or (here / path).exists():
        return str(path)
    for folder in here.absolute().parents:
        if (folder / path).exists():
            return str(folder / path)
    return str(path)


def default_db(name: str = DEFAULT_DB_NAME, *, start: str | Path | None = None,
               environ: dict[str, str] | None = None) -> str:
    """The capture database to use when no path was given (see the module docstring)."""
    env = os.environ if environ is None else environ
    here = _here(start)
    value = (env.get(DB_ENV) or "").strip()
    if value:
        return _from_env(value, here)
    found = nearest_captures_dir(here)
    if found is not None:
        return _display(found / name, here.absolute())
    return str(Path(CAPTURES_DIR) / name)


def describe_rule(name: str = DEFAULT_DB_NAME) -> str:
    """The rule in one line, for ``--help`` texts and error messages."""
    return RULE.format(name=name)

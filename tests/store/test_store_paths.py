"""One default-database rule (``workbench.store.paths``) for the CLI, the TUI, the web UI, the
capture addon and notebooks: ``--db``, else ``$WORKBENCH_DB``, else the nearest ``captures/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.notebook import default_db as notebook_default_db
from workbench.notebook import demo_db
from workbench.store.db import SessionInfo, Store
from workbench.store.paths import DB_ENV, default_db, nearest_captures_dir

WORKBENCH = str(Path(sys.executable).parent / "workbench")


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "repo"
    deep = root / "notebooks" / "sub"
    deep.mkdir(parents=True)
    (root / "captures").mkdir()
    return root, deep


def test_nearest_captures_folder_from_any_depth(tmp_path: Path) -> None:
    root, deep = _tree(tmp_path)
    assert nearest_captures_dir(deep) == (root / "captures").absolute()
    assert default_db(start=deep, environ={}) == str((root / "captures" / "workbench.duckdb").absolute())
    assert default_db(start=root, environ={}) == os.path.join("captures", "workbench.duckdb")
    assert default_db("demo.duckdb", start=deep, environ={}) == str((root / "captures" / "demo.duckdb").absolute())
    # nothing above: ./captures/workbench.duckdb (the first capture creates it)
    lone = tmp_path / "lone"
    lone.mkdir()
    assert nearest_captures_dir(lone) is None
    assert default_db(start=lone, environ={}) == os.path.join("captures", "workbench.duckdb")


def test_environment_variable_wins_and_relative_values_are_found_upwards(tmp_path: Path) -> None:
    root, deep = _tree(tmp_path)
    db = root / "captures" / "mine.duckdb"
    db.touch()
    assert default_db(start=deep, environ={DB_ENV: str(db)}) == str(db)
    # relative to the repository root, used from notebooks/sub: found in the parent that has it
    assert default_db(start=deep, environ={DB_ENV: "captures/mine.duckdb"}) == str(db)
    assert default_db(start=deep, environ={DB_ENV: "captures/none.duckdb"}) == "captures/none.duckdb"
    # the demo's notebooks read $WORKBENCH_DB too
    assert default_db("demo.duckdb", start=deep, environ={DB_ENV: str(db)}) == str(db)


def test_notebook_helpers_follow_the_rule(tmp_path: Path, monkeypatch: object) -> None:
    root, deep = _tree(tmp_path)
    mp = monkeypatch
    mp.delenv(DB_ENV, raising=False)  # type: ignore[attr-defined]
    mp.chdir(deep)  # type: ignore[attr-defined]
    assert notebook_default_db() == str((root / "captures" / "workbench.duckdb").absolute())
    assert demo_db() == str((root / "captures" / "demo.duckdb").absolute())


def _db_with_session(path: Path, sid: str) -> None:
    with Store(path) as store:
        store.upsert_sessions([SessionInfo(sid, transport="run", status="complete", label="found it")])


@pytest.mark.slow
def test_cli_finds_the_database_from_a_subfolder_and_honours_the_variable(tmp_path: Path) -> None:
    root, deep = _tree(tmp_path)
    _db_with_session(root / "captures" / "workbench.duckdb", "from-captures")
    other = tmp_path / "elsewhere.duckdb"
    _db_with_session(other, "from-env")
    env = {k: v for k, v in os.environ.items() if k != DB_ENV}

    r = subprocess.run([WORKBENCH, "sessions", "--json"], cwd=deep, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["session_id"] for line in r.stdout.splitlines()] == ["from-captures"]

    r = subprocess.run([WORKBENCH, "sessions", "--json"], cwd=deep, env={**env, DB_ENV: str(other)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["session_id"] for line in r.stdout.splitlines()] == ["from-env"]

    # --db wins over both
    r = subprocess.run([WORKBENCH, "sessions", "--json", "--db", str(other)], cwd=deep,
                       env={**env, DB_ENV: "nowhere.duckdb"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "from-env" in r.stdout

    # --help names the rule and the file it resolves to here
    r = subprocess.run([WORKBENCH, "sessions", "--help"], cwd=deep, env=env, capture_output=True, text=True,
                       timeout=60)
    flat = " ".join(r.stdout.split())
    assert "$WORKBENCH_DB" in flat and str(root / "captures" / "workbench.duckdb") in flat.replace(" ", "")

"""One error type: every user-facing error derives from WorkbenchError, which ``workbench`` turns
into ``workbench <cmd>: <message>`` and exit 2; nothing below the CLI imports ``workbench.cli``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import duckdb
import pytest

from workbench import cli
from workbench.errors import CliError, WorkbenchError
from workbench.store.db import StoreError, database_errors_named

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"

# (module, class): the errors the module docstring of workbench.errors lists.
SUBSYSTEM_ERRORS = [
    ("workbench.schema.loader", "SchemaError"),
    ("workbench.schema.extract", "ExtractError"),
    ("workbench.schema.merge", "MergeError"),
    ("workbench.store.db", "StoreError"),
    ("workbench.store.schema", "SchemaVersionError"),
    ("workbench.store.readonly", "QueryRefused"),
    ("workbench.ingest", "IngestError"),
    ("workbench.export.parquet", "ParquetError"),
    ("workbench.fixtures.format", "FixtureError"),
    ("workbench.sim.scenario", "ScenarioError"),
    ("workbench.client.net", "NetError"),
    ("workbench.client.transport", "TransportError"),
    ("workbench.client.events", "AgentError"),
    ("workbench.notebook", "NotebookError"),
]


@pytest.mark.parametrize(("module", "name"), SUBSYSTEM_ERRORS)
def test_subsystem_error_derives_from_the_base(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, WorkbenchError)
    assert name in (importlib.import_module("workbench.errors").__doc__ or ""), "listed in workbench.errors"


def test_cli_error_is_the_one_workbench_cli_exports() -> None:
    assert cli.CliError is CliError
    assert issubclass(CliError, WorkbenchError)


def _imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_nothing_below_the_cli_imports_it() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in ("workbench/cli.py", "workbench/__main__.py") or "/schema/proto/" in rel:
            continue
        if "workbench.cli" in _imports_of(path):
            offenders.append(rel)
    assert offenders == []


def test_errors_module_imports_nothing_of_ours() -> None:
    assert not {n for n in _imports_of(PACKAGE / "errors.py") if n.startswith("workbench")}


@pytest.mark.parametrize("error", [CliError("--port 70000: not a port"), StoreError("x.duckdb: damaged"),
                                   WorkbenchError("plain base")])
def test_main_prints_any_workbench_error_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str],
                                                     error: WorkbenchError) -> None:
    def fail(_args: object) -> int:
        raise error

    parser = cli.build_parser()
    args = parser.parse_args(["decode", "00"])
    monkeypatch.setattr(args, "func", fail)
    monkeypatch.setattr(cli, "build_parser", lambda *_: _FixedParser(args))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err == f"workbench decode: {error}\n"


def test_main_lets_other_exceptions_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(_args: object) -> int:
        raise RuntimeError("a bug, not a user error")

    args = cli.build_parser().parse_args(["decode", "00"])
    monkeypatch.setattr(args, "func", fail)
    monkeypatch.setattr(cli, "build_parser", lambda *_: _FixedParser(args))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main([])


class _FixedParser:
    """Stands in for the argparse parser so main() runs a command of the test's choosing."""

    def __init__(self, args: object) -> None:
        self.args = args

    def parse_args(self, _argv: object) -> object:
        return self.args


def test_unanticipated_duckdb_error_names_the_database(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    con = duckdb.connect(str(db))
    with pytest.raises(StoreError, match=r"c\.duckdb: .*no_such_table"), database_errors_named(db):
        con.execute("SELECT * FROM no_such_table")
    con.close()


def test_duckdb_error_without_a_database_passes_unchanged() -> None:
    con = duckdb.connect(":memory:")
    with pytest.raises(duckdb.CatalogException), database_errors_named(None):
        con.execute("SELECT * FROM no_such_table")

"""Start-up: a command imports only what it uses (issue 24).

``workbench --help`` lists a static table of commands (``workbench.commands.table.COMMANDS``,
re-exported as ``workbench.cli.COMMANDS``) instead of importing every command module; ``decode`` needs protobuf but no database; ``sessions`` reads a
database but has no use for pandas. Each case runs the real command line in a fresh interpreter
and looks at ``sys.modules`` once it has finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli
from workbench.commands import table

HEAVY = ("duckdb", "pyarrow", "pandas", "textual", "httpx", "mitmproxy")

# Runs the command line as the `workbench` script does (sys.argv, main()), then writes the names of
# the modules it imported to the file named by argv[1].
_WRAPPER = """
import json, sys
out = sys.argv.pop(1)
sys.argv[0] = "workbench"
from workbench.cli import main
try:
    rc = main()
except SystemExit as exc:
    rc = exc.code
with open(out, "w") as fh:
    json.dump(sorted(sys.modules), fh)
sys.exit(rc)
"""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if k != "_ARGCOMPLETE"}
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, str(out), *args], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc, set(json.loads(out.read_text()))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules)


def test_the_command_table_is_what_the_modules_register() -> None:
    """The static table says what the full parser says: same commands, same order, same help.

    The help of a stub comes from the table and so does the help a module's register() gives
    (table.add_command): a command a module added any other way, or one the table lacks, shows here."""
    full = cli.build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    registered = [(c.dest, c.help) for c in sub._choices_actions]
    assert registered == [(name, help_text) for name, help_text, _ in cli.COMMANDS]


def test_every_command_says_what_it_does_in_its_own_help() -> None:
    """Each command's ``--help`` opens with its paragraph from the table (``DESCRIPTIONS``), one per
    command, none left without (``frames``, ``blobs``, ``tools`` and ``demo`` had none)."""
    assert set(table.DESCRIPTIONS) == {name for name, _, _ in cli.COMMANDS}
    full = cli.build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert parser.description == table.DESCRIPTIONS[name], name
        assert len(parser.description) > 60, name   # a paragraph, not a stub
        # argparse rewraps the paragraph (at spaces and after hyphens): compare without whitespace
        flat = "".join(parser.format_help().split())
        assert "".join(table.DESCRIPTIONS[name].split()) in flat, name


def test_the_cli_table_is_the_one_in_commands() -> None:
    assert cli.COMMANDS is table.COMMANDS
    assert cli.COMMAND_MODULES == table.COMMAND_MODULES


def test_a_command_the_table_lacks_cannot_be_added() -> None:
    sub = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(LookupError, match="'nosuch' is not in workbench.commands.table.COMMANDS"):
        table.add_command(sub, "nosuch")
    assert table.add_command(sub, "decode", description="d").description == "d"
    assert [c.help for c in sub._choices_actions] == ["decode frames given as hex, a file or stdin"]


@pytest.mark.parametrize("module", cli.COMMAND_MODULES)
def test_each_module_registers_the_commands_the_table_gives_it(module: str) -> None:
    parser = cli.build_parser({module})
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    complete = {name for name, p in sub.choices.items() if p.get_default("func") is not None}
    assert complete == {name for name, _, m in cli.COMMANDS if m == module}


@pytest.mark.parametrize(("argv", "modules"), [
    (["decode", "00"], {"workbench.commands.core"}), (["--help"], set()), (["--version", "tui"], {"workbench.tui.cli"}),
    (["nosuch"], set()), ([], set()),
    # import formats added by other modules' register(): parquet exports, replay fixtures
    (["import", "x"], {"workbench.ingest.cli", "workbench.export.cli", "workbench.fixtures.cli"}),
])
def test_a_command_line_loads_the_module_of_its_command(argv: list[str], modules: set[str]) -> None:
    assert cli.modules_for(argv) == modules


@pytest.mark.slow
def test_help_imports_no_command_module_and_nothing_heavy(tmp_path: Path) -> None:
    proc, modules = _run(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    # every command is listed, with its help, from the table alone
    for name, _help, _module in cli.COMMANDS:
        assert f"\n    {name}" in proc.stdout
    assert _loaded(modules, HEAVY) == []
    assert _loaded(modules, tuple(cli.COMMAND_MODULES)) == []


@pytest.mark.slow
def test_decode_imports_nothing_heavy(tmp_path: Path) -> None:
    proc, modules = _run(tmp_path, "decode", "00000000040a026a00")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "interaction_update.heartbeat"
    assert _loaded(modules, HEAVY) == []
    assert "workbench.tui.cli" not in modules


@pytest.mark.slow
def test_command_help_builds_only_that_command(tmp_path: Path) -> None:
    proc, modules = _run(tmp_path, "sql", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--max-result-mb" in proc.stdout
    assert _loaded(modules, HEAVY) == []


@pytest.mark.slow
def test_sessions_on_a_small_database_imports_neither_pyarrow_nor_numpy(tmp_path: Path) -> None:
    from workbench.tui.sample_db import build_sample_db

    db = tmp_path / "capture.duckdb"
    build_sample_db(db)  # three sessions
    proc, modules = _run(tmp_path, "sessions", "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "top_finding" in proc.stdout.splitlines()[0]
    assert "(3 rows)" in proc.stdout
    # a listing reads its rows as tuples (Reader.rows): importing pyarrow with numpy costs it about
    # 0.1 s on a quiet machine, a third of its whole budget (benchmarks/startup.py)
    assert _loaded(modules, ("pyarrow", "numpy", "pandas", "textual", "httpx", "mitmproxy")) == []
    # a read decodes nothing: the decoder (and with it the compiled schema) and pyarrow.compute belong to
    # the write path
    assert _loaded(modules, ("workbench.decode.classify", "pyarrow.compute")) == []


@pytest.mark.slow
def test_import_alone_still_reads_the_formats_other_commands_add(tmp_path: Path) -> None:
    """`export` and `export-fixture` register their import formats when their module registers its
    commands; `workbench import` in a fresh process, with no other command parsed, must know them."""
    from workbench.export.parquet import export_parquet
    from workbench.fixtures.export import export_session
    from workbench.fixtures.format import dump
    from workbench.store.reader import open_reader
    from workbench.tui.sample_db import build_sample_db

    db = build_sample_db(tmp_path / "capture.duckdb")
    export_parquet(db, tmp_path / "pq")
    reader = open_reader(db)
    try:
        sid = reader.query("SELECT min(session_id) FROM sessions").column(0)[0].as_py()
        fixture = dump(export_session(reader, sid), tmp_path / "fx.json")
    finally:
        reader.close()
    for source, fmt in ((tmp_path / "pq", "parquet"), (fixture, "fixture")):
        proc, _ = _run(tmp_path, "import", str(source), "--db", str(tmp_path / f"{fmt}.duckdb"), "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[0])["format"] == fmt

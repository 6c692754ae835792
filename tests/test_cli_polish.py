"""The command line explains itself: help text on every option and argument, ``--json`` on every
command that reports, and shell completion through argcomplete in a real bash."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.cli import build_parser

BIN = Path(sys.executable).parent
# Commands that only serve or hand over to something else (a server, the TUI, a child process, the
# built-in client streaming text); everything else reports and must offer --json.
NOT_REPORTING = {"demo", "tui", "web", "capture", "sim", "proxy", "client", "run"}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, parser, action


def _leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaf_commands(sub, (*path, name))


def test_every_option_and_argument_has_help() -> None:
    missing = [f"workbench {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
               for path, _, a in _walk(build_parser()) if not (a.help or "").strip()]
    assert missing == []


def test_every_command_that_reports_offers_json() -> None:
    leaves = list(_leaf_commands(build_parser()))
    assert len(leaves) > 15
    lacking = [" ".join(path) for path, p in leaves
               if path[0] not in NOT_REPORTING and not any("--json" in a.option_strings for a in p._actions)]
    assert lacking == []


@pytest.mark.slow
def test_export_and_export_fixture_report_as_json(tmp_path: Path) -> None:
    from workbench.tui.sample_db import build_sample_db

    db = tmp_path / "capture.duckdb"
    build_sample_db(db)
    env = {**os.environ, "WORKBENCH_DB": str(db)}
    out = subprocess.run([str(BIN / "workbench"), "export", "--db", str(db), "--parquet", str(tmp_path / "pq"),
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["directory"] == str(tmp_path / "pq")
    assert doc["rows"]["frames"] > 0
    sid = doc["sessions"][0]
    fx = subprocess.run([str(BIN / "workbench"), "export-fixture", "--db", str(db), sid, "-o",
                         str(tmp_path / "fx.json"), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert fx.returncode == 0, fx.stderr
    line = json.loads(fx.stdout)
    assert line["session_id"] == sid
    assert Path(line["path"]).is_file()
    assert line["frames"] == len(json.loads(Path(line["path"]).read_text())["frames"])


@pytest.mark.slow
def test_import_reports_each_file_as_json_errors_included(tmp_path: Path) -> None:
    sample = Path(__file__).resolve().parents[1] / "captures" / "samples" / "cli-stream-json.ndjson"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00not a recording")
    db = tmp_path / "capture.duckdb"
    proc = subprocess.run([str(BIN / "workbench"), "import", str(sample), str(junk), "--db", str(db), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    first, second = (json.loads(line) for line in proc.stdout.splitlines())
    assert first["format"] == "ndjson"
    assert first["frames"] > 0
    assert len(first["session_ids"]) == first["sessions"] == 1
    assert second["file"] == str(junk)
    assert "not a recognised format" in second["error"]


def _complete(line: str, words: list[str]) -> list[str]:
    """What bash offers after the documented activation line, for the words typed so far."""
    script = (f'eval "$(register-python-argcomplete workbench)"; COMP_WORDS=({" ".join(repr(w) for w in words)}); '
              f'COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; '
              '_python_argcomplete workbench; printf "%s\\n" "${COMPREPLY[@]}"')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [w.strip() for w in proc.stdout.splitlines() if w.strip()]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_choices() -> None:
    assert _complete("workbench sess", ["workbench", "sess"]) == ["sessions"]
    assert _complete("workbench frames --dir", ["workbench", "frames", "--dir"]) == ["--direction"]
    assert sorted(_complete("workbench frames --direction ", ["workbench", "frames", "--direction", ""])) == [
        "client", "server"]

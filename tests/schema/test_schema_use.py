"""``workbench schema use / show / --reset``: an extracted schema becomes what decode, imports,
diagnose and the TUI read with; ``--proto`` still overrides; sessions record what they were read with.

The schema is the one `schema extract` recovers from the next build's bundle (next_build.py); the
traffic is that build's turn recorded through real mitmdumps (a capture read with the overlay, and
a flow file). Every CLI call runs with its own ``XDG_CONFIG_HOME``, never the user's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from next_build import server_messages

from workbench.wire.envelope import encode


def _wb(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env=env, input=stdin)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _show(config: Path, *extra: str) -> dict[str, Any]:
    return json.loads(_ok(_wb(config, "schema", "show", "--json", *extra)))  # type: ignore[no-any-return]


def _decode(config: Path, next_proto: Path, *extra: str) -> list[dict[str, Any]]:
    lines = [json.dumps({"hex": encode(m).hex(), "direction": "server", "transport": "run"})
             for m in server_messages(next_proto)]
    out = _ok(_wb(config, "decode", "--batch", *extra, stdin="\n".join(lines) + "\n"))
    return [json.loads(line) for line in out.splitlines()]


def _sql(db: Path, sql: str) -> list[dict[str, Any]]:
    from workbench.store import open_reader

    r = open_reader(db)
    try:
        return r.query(sql).to_pylist()  # type: ignore[no-any-return]
    finally:
        r.close()


@pytest.mark.slow
def test_use_show_reset_change_what_decode_reads(next_extracted: Path, next_proto: Path, tmp_path: Path) -> None:
    config = tmp_path / "config"
    before = _show(config)
    assert before["via"] == "built-in"
    assert before["identity"]["source"] == "built-in overlay"
    kinds_before = [d["kind"] for d in _decode(config, next_proto)]
    assert "exec_server_message.56" in kinds_before

    out = _ok(_wb(config, "schema", "use", str(next_extracted)))
    assert out.startswith(f"now active: {next_extracted.resolve()}: hash ")
    shown = _show(config)
    assert shown["via"] == "schema use"
    assert shown["config"] == str(config / "workbench" / "schema.json")
    assert shown["copied_from"] == [str(next_extracted.resolve())]
    copy = Path(shown["paths"][0])
    assert copy.parent == config / "workbench" / "schemas"
    assert copy.name == shown["identity"]["hash"] + ".pb"
    assert shown["identity"]["source"] == str(next_extracted.resolve())
    assert shown["identity"]["messages"] == before["identity"]["messages"] + 1  # PlanReviewArgs
    text = _ok(_wb(config, "schema", "show"))
    assert f"recorded in {config / 'workbench' / 'schema.json'}" in text
    assert f"hash: {shown['identity']['hash']}" in text

    decoded = _decode(config, next_proto)
    assert "exec_server_message.plan_review_args" in [d["kind"] for d in decoded]
    shell = next(d for d in decoded if d["kind"] == "exec_server_message.shell_args")
    assert shell["fields"]["exec_server_message"]["shell_args"] == {
        "command": "make lint", "cwd": "/repo", "sandbox_profile": "workspace-write"}
    assert [d["summary"] for d in decoded][0] == 'text "Linting, then the logo."'
    # --proto still overrides the default, `--proto builtin` included
    assert [d["kind"] for d in _decode(config, next_proto, "--proto", "builtin")] == kinds_before
    assert _show(config, "--proto", "builtin")["via"] == "--proto"

    # The copy is the schema: the extraction may go away.
    moved = tmp_path / "moved"
    shutil.copytree(next_extracted, moved)
    assert [d["kind"] for d in _decode(config, next_proto)] == [d["kind"] for d in decoded]

    assert _ok(_wb(config, "schema", "use", "--reset")).startswith("back to the built-in overlay (removed ")
    assert not copy.exists()
    assert _show(config)["via"] == "built-in"
    assert [d["kind"] for d in _decode(config, next_proto)] == kinds_before


@pytest.mark.slow
def test_import_diagnose_and_tui_use_it_and_sessions_say_so(next_extracted: Path, next_recording: tuple[Path, Path],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture_db, flows = next_recording
    config = tmp_path / "config"
    _ok(_wb(config, "schema", "use", str(next_extracted)))
    ident = _show(config)["identity"]

    db = tmp_path / "imported.duckdb"
    _ok(_wb(config, "import", str(flows), "--db", str(db)))
    session = _sql(db, "SELECT session_id, meta FROM sessions")
    assert len(session) == 1
    assert json.loads(session[0]["meta"])["schema"] == {"hash": ident["hash"], "source": ident["source"],
                                                        "messages": ident["messages"]}
    kinds = [r["kind"] for r in _sql(db, "SELECT kind FROM frames ORDER BY seq")]
    assert "exec_server_message.plan_review_args" in kinds
    # The capture was decoded by the overlay (nothing configured then), and says so.
    overlay = json.loads(_sql(capture_db, "SELECT meta FROM sessions")[0]["meta"])["schema"]
    assert overlay["source"] == "built-in overlay"
    assert overlay["hash"] != ident["hash"]

    # diagnose reads the kinds each import gave its frames: the parked exec is named by the schema.
    imported = _wb(config, "diagnose", "--all", "--no-write", "--db", str(db))
    assert imported.returncode == 1, imported.stderr
    # (an import may order frames causally, so the seq is not pinned)
    assert re.search(r"exec 3 \(plan_review_args\) at seq \d+ was never answered", imported.stdout), imported.stdout
    captured = _wb(config, "diagnose", "--all", "--no-write", "--db", str(capture_db))
    assert "exec 3 (56) at seq 5 was never answered" in captured.stdout

    # The TUI's data layer, built as `workbench tui` builds it, decodes the overlay's capture anew.
    from workbench.commands.common import decoder_from
    from workbench.tui.data import TuiData

    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    sid = _sql(capture_db, "SELECT session_id FROM sessions")[0]["session_id"]
    data = TuiData(capture_db, decoder_from(argparse.Namespace(proto=[])))
    try:
        detail = data.frame_detail(sid, 5)
        assert detail is not None
        assert detail.kind == "exec_server_message.56"  # as recorded
        assert detail.tree == {"exec_server_message": {"id": 3, "plan_review_args": {
            "plan_uri": "plan://7", "reviewers": ["ana"]}}}
    finally:
        data.close()
    overlay_data = TuiData(capture_db, decoder_from(argparse.Namespace(proto=["builtin"])))
    try:
        tree = overlay_data.frame_detail(sid, 5).tree  # type: ignore[union-attr]
        assert tree == {"exec_server_message": {"id": 3, "56": {"1": "plan://7", "2": "ana"}}}
    finally:
        overlay_data.close()


@pytest.mark.slow
def test_link_refers_to_the_folder_and_a_vanished_one_is_an_error(next_extracted: Path, next_proto: Path,
                                                                   tmp_path: Path) -> None:
    config = tmp_path / "config"
    linked = tmp_path / "linked"
    shutil.copytree(next_extracted, linked)
    _ok(_wb(config, "schema", "use", "--link", str(linked)))
    shown = _show(config)
    assert shown["paths"] == [str(linked.resolve())]
    assert shown["copied_from"] is None
    assert not (config / "workbench" / "schemas").exists()
    shutil.rmtree(linked)
    proc = _wb(config, "decode", "--batch", stdin="")
    assert proc.returncode == 2
    assert str(config / "workbench" / "schema.json") in proc.stderr
    assert "linked" in proc.stderr
    assert "Traceback" not in proc.stderr
    _ok(_wb(config, "schema", "use", "--reset"))
    _ok(_wb(config, "decode", "--batch", stdin=""))


@pytest.mark.slow
def test_bad_schemas_and_a_damaged_config_exit_2_naming_them(next_recording: tuple[Path, Path], next_proto: Path,
                                                             tmp_path: Path) -> None:
    config = tmp_path / "config"
    missing = _wb(config, "schema", "use", str(tmp_path / "no-such-schema"))
    assert missing.returncode == 2
    assert "no-such-schema" in missing.stderr
    assert not (config / "workbench" / "schema.json").exists()

    broken = tmp_path / "broken"
    (broken / "agent/v1").mkdir(parents=True)
    (broken / "agent/v1/agent.proto").write_text('syntax = "proto3";\npackage agent.v1;\nmessage Broken {\n')
    bad = _wb(config, "schema", "use", str(broken))
    assert bad.returncode == 2
    assert "agent.proto" in bad.stderr
    assert not (config / "workbench" / "schema.json").exists()

    assert _wb(config, "schema", "use").returncode == 2
    (config / "workbench").mkdir(parents=True)
    (config / "workbench" / "schema.json").write_text("{not json")
    db = tmp_path / "x.duckdb"
    for args in (("schema", "show"), ("decode", "--batch"), ("import", str(next_recording[1]), "--db", str(db))):
        proc = _wb(config, *args, stdin="")
        assert proc.returncode == 2, args
        assert "schema.json" in proc.stderr, args
        assert "Traceback" not in proc.stderr
    assert not db.exists() or not _sql(db, "SELECT * FROM sessions")  # the import wrote nothing
    _ok(_wb(config, "schema", "use", str(next_proto)))  # a new `use` replaces the damaged file
    assert _show(config)["via"] == "schema use"
    _ok(_wb(config, "schema", "use", "builtin"))  # the same as --reset
    assert _show(config)["via"] == "built-in"
    assert list((config / "workbench" / "schemas").iterdir()) == []

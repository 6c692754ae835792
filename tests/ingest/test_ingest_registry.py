"""The importer registry (plug-in formats), progress output, and the committed sample files."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.decode.classify import Frame
from workbench.ingest import IMPORTERS, ImportContext, ImportResult, Progress, register_importer
from workbench.store import SessionInfo, now_us, open_reader
from workbench.store.recorder import Recorder

DATA = Path(__file__).parent / "data"
SAMPLE = Path(__file__).parents[2] / "captures" / "samples" / "cli-stream-json.ndjson"


@pytest.fixture
def demo_format() -> Iterator[None]:
    def detect(path: Path, head: bytes) -> bool:
        return path.is_dir() and (path / "DEMO").exists()

    def run(ctx: ImportContext) -> ImportResult:
        rec = Recorder(ctx.store)
        rec.open_session(SessionInfo("demo-1", source="demo", transport="unary"))
        rec.add("demo-1", now_us(), "server", "unary", None, Frame("unary", "demo", b"\x08\x01"))
        rec.flush()
        ctx.progress.update(1)
        return ImportResult(str(ctx.path), "demo", sessions=1, frames=1, session_ids=["demo-1"])

    register_importer("demo", detect, run)
    try:
        yield
    finally:
        IMPORTERS.pop("demo", None)


def test_plugin_format_directory(tmp_path: Path, demo_format: None, capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "DEMO").write_text("x")
    db = tmp_path / "d.duckdb"
    assert main(["import", str(export), "--db", str(db)]) == 0  # auto-detected
    assert capsys.readouterr().out.strip() == f"imported {export}: 1 session, 1 frame"
    assert main(["import", str(export), "--db", str(db), "--format", "demo"]) == 0
    r = open_reader(db)
    assert r.query("SELECT session_id, source FROM sessions").to_pylist() == [
        {"session_id": "demo-1", "source": "demo"}]
    r.close()


def test_progress_on_a_terminal_only() -> None:
    out = io.StringIO()
    p = Progress("big.flows", total=200, unit="flows", stream=out, enabled=True, interval=0)
    p.update(50, 7)
    p.update(200, 30)
    p.finish()
    text = out.getvalue()
    assert "\rimporting big.flows:  25.0% (7 flows)" in text
    assert "100.0% (30 flows)" in text
    assert text.endswith("\r\x1b[K")
    quiet = io.StringIO()
    q = Progress("x", total=10, stream=quiet)  # StringIO is no TTY
    q.update(5)
    q.finish()
    assert quiet.getvalue() == ""


def test_committed_samples_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "c.duckdb"
    files = [SAMPLE, DATA / "agent.flows", DATA / "agent.har"]
    assert main(["import", *map(str, files), "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"imported {SAMPLE}: 1 session, 20 frames"
    assert out[1].startswith(f"imported {DATA / 'agent.flows'}: 6 sessions, 24 frames (1 flow without bodies")
    assert out[2].startswith(f"imported {DATA / 'agent.har'}: 6 sessions, 24 frames (1 entry without bodies")

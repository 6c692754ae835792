"""The TUI's data layer over a real capture database (no terminal involved)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from workbench.tui.data import FrameFilter, FrameIndex, TuiData, blob_needle, pretty_blob, sha256_check
from workbench.tui.replay import IDLE_CAP_US, ReplayClock
from workbench.tui.sample_db import ERR_SESSION, HANG_SESSION, OK_SESSION
from workbench.wire.envelope import encode


def test_filter_parse() -> None:
    f = FrameFilter.parse('kind:exec_server,kv dir:server "two words" more')
    assert f.kinds == ("exec_server", "kv")
    assert f.direction == "server"
    assert f.text == "two words more"
    assert FrameFilter.parse("> hello").direction == "client"
    assert FrameFilter.parse("<").direction == "server"
    assert not FrameFilter.parse("").active
    with pytest.raises(ValueError, match="direction must be client or server"):
        FrameFilter.parse("dir:sideways")


def test_blob_needle_matches_duckdb_escaping() -> None:
    assert blob_needle("pytest -q") == "pytest -q"
    assert blob_needle("é") == "\\xC3\\xA9"


def test_frame_index_folds_expands_and_cuts() -> None:
    hb = np.array([0, 1, 1, 1, 0, 1, 0, 1, 1, 0], dtype=bool)
    ix = FrameIndex(np.arange(10) * 2, hb)
    rows = ix.rows(0, 100)
    assert [(r.seq, r.fold, r.count) for r in rows] == [
        (0, False, 1), (2, True, 3), (8, False, 1), (10, False, 1), (12, False, 1), (14, True, 2), (18, False, 1)]
    assert ix.row_of_seq(4) == 1          # hidden inside the folded run: its header row
    assert ix.row_of_seq(5) == -1         # no such frame
    ix.expand_around(4)
    assert len(ix) == 10
    assert ix.row(ix.row_of_seq(4)).member
    assert ix.row(1).fold
    assert ix.row(1).expanded
    ix.set_limit(9)                       # replay reached seq 9: frames 0..8
    assert ix.visible == 5
    assert ix.row_of_seq(10) == -1
    ix.set_limit(None)
    ix.extend([20, 22], [True, True])
    assert ix.row(len(ix) - 1).fold
    assert ix.row(len(ix) - 1).count == 2
    ix.set_fold(False)
    assert len(ix) == 12


def test_sessions_and_finding_counts(tui_sample_db: Path) -> None:
    data = TuiData(tui_sample_db)
    by_id = {s.session_id: s for s in data.sessions()}
    assert set(by_id) == {HANG_SESSION, OK_SESSION, ERR_SESSION}
    hang = by_id[HANG_SESSION]
    assert hang.findings == {"error": 1, "warning": 1, "info": 1}
    assert hang.findings_text() == "1E 1W 1I"
    assert hang.frame_count == 61
    assert hang.status == "incomplete"
    assert by_id[OK_SESSION].findings_text() == "-"
    assert data.resolve("run-7f") == HANG_SESSION
    assert data.resolve("run-") is None   # ambiguous
    data.close()


def test_frame_filters_and_folded_page(tui_sample_db: Path) -> None:
    data = TuiData(tui_sample_db)
    assert data.frame_count(HANG_SESSION) == 61
    # text inside the protobuf payload (the shell command), not only in summaries
    hits = data.frame_index(HANG_SESSION, FrameFilter.parse('"working_directory"'))
    assert hits.total >= 1
    kinds = {r["kind"] for r in data.frame_rows(HANG_SESSION, hits.seqs.tolist()).values()}
    assert "interaction_update.partial_tool_call" in kinds
    assert data.frame_count(HANG_SESSION, FrameFilter.parse("kind:exec dir:client")) == 2
    page = data.frame_page(HANG_SESSION, 0, 100)
    folds = [r for r in page if r["fold"]]
    assert len(folds) == 1
    assert folds[0]["count"] == 44
    assert folds[0]["client_count"] == 7
    assert (folds[0]["last_ts_us"] - folds[0]["ts_us"]) / 1e6 == pytest.approx(72.0)
    assert page[0]["kind"] == "run_request"
    seqs, hb, up = data.new_frames_since(HANG_SESSION, 55)
    assert seqs.tolist() == [56, 57, 58, 59, 60]
    assert hb.all()
    data.close()


def test_frame_detail_rebuilds_envelope_header(tui_sample_db: Path) -> None:
    data = TuiData(tui_sample_db)
    seq = data.findings(HANG_SESSION)[0].evidence[0]
    d = data.frame_detail(HANG_SESSION, seq)
    assert d is not None
    assert d.kind == "exec_server_message.shell_stream_args"
    assert d.header == encode(d.payload)[:5]
    assert d.tree["exec_server_message"]["shell_stream_args"]["command"] == "pytest -q"
    assert '"shell_stream_args"' in d.as_json()
    err = data.frame_detail(ERR_SESSION, 1)
    assert err is not None
    assert err.header[0] == 0x02
    assert err.tree["error"]["code"] == "resource_exhausted"
    assert data.frame_detail(HANG_SESSION, 10_000) is None
    data.close()


def test_findings_tool_calls_blobs(tui_sample_db: Path) -> None:
    data = TuiData(tui_sample_db)
    findings = data.findings(HANG_SESSION)
    assert [f.severity for f in findings] == ["error", "warning", "info"]
    assert findings[0].code == "exec_no_stream_close"
    calls = data.tool_calls(HANG_SESSION)
    assert calls[0]["call_id"] == "toolu_01"
    assert calls[0]["args_naive"].startswith('{"command{"command')
    blobs = data.blobs(HANG_SESSION)
    assert [b["status"] for b in blobs].count("miss") == 1
    stored = next(b for b in blobs if b["role"] == "system")
    raw = data.blob_data(HANG_SESSION, stored["blob_id"])
    assert sha256_check(stored["blob_id"], raw) == (True, hashlib.sha256(raw or b"").hexdigest())
    assert sha256_check("00" * 32, raw)[0] is False
    assert '"role": "system"' in pretty_blob(raw)
    assert pretty_blob(None) == "(no data captured)"
    data.close()


def test_replay_clock() -> None:
    seqs = np.arange(5)
    ts = np.array([0, 100_000, 200_000, 10_200_000, 10_300_000])
    clock = ReplayClock(seqs, ts)
    assert clock.pos == -1
    assert clock.advance(0.0)
    assert clock.pos == 0
    clock.speed = 2.0
    clock.advance(0.1)            # 0.2 s of session time
    assert clock.seq == 2
    assert not clock.advance(1.0)  # still inside the 10 s gap
    clock.skip_idle = True
    clock.advance(0.0)             # the gap is capped at IDLE_CAP_US: jump to just before frame 3
    assert clock.vt == 10_200_000 - IDLE_CAP_US
    clock.advance(0.5)
    assert clock.seq == 3
    clock.step(-2)
    assert clock.seq == 1
    assert clock.vt == 100_000
    clock.seek_end()
    assert clock.at_end
    assert "frame 5/5" in clock.describe()
    assert clock.faster(10) == 20.0
    assert clock.faster(-10) == 0.5


def test_a_gzip_frame_shows_its_length_on_the_wire(tmp_path: Path) -> None:
    from workbench.decode.classify import default_decoder
    from workbench.schema import pb
    from workbench.store.db import SessionInfo, Store
    from workbench.store.recorder import Recorder
    from workbench.tui.detail import hex_dump

    text = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="compressible " * 200))).SerializeToString()
    wire = encode(text, compress=True)
    [frame] = default_decoder().stream("run", "server").feed(wire)
    store = Store(tmp_path / "gz.duckdb")
    rec = Recorder(store)
    rec.open_session(SessionInfo("gz", transport="run"))
    rec.add("gz", 1, "server", "run", None, frame)
    rec.flush()
    store.close()
    data = TuiData(tmp_path / "gz.duckdb")
    d = data.frame_detail("gz", 0)
    data.close()
    assert d is not None
    assert d.payload == text  # stored inflated
    assert d.header == wire[:5]  # flags 0x01 and the compressed length, as sent
    shown = hex_dump(d.header, d.payload, enveloped=d.enveloped, flags=d.flags).plain
    assert f"flags 0x01 (gzip) | length {len(wire) - 5} on the wire" in shown
    assert f"payload shown inflated ({len(text)} bytes)" in shown


@pytest.mark.slow
def test_live_only_while_a_proved_capture_serves_the_database(tmp_path: Path) -> None:
    """"● live" came from the sidecar's pid alone: a stale sidecar naming any running process (a
    reused pid, PID 1 in a container) showed a file nobody writes as live. It now follows the reader
    ``open_reader`` trusted after the handshake, in follow mode too."""
    import json
    import os

    from workbench.store import LiveService, Store
    from workbench.store.reader import sidecar_path
    from workbench.tui.sample_db import build_sample_db

    db = build_sample_db(tmp_path / "capture.duckdb")
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t", "pid": os.getpid()}))
    os.chmod(side, 0o600)
    for transient in (False, True):
        data = TuiData(db, transient=transient)
        assert len(data.sessions()) == 3  # read from the file: the sidecar is stale
        assert not data.live
        data.close()
    side.unlink()
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        for transient in (False, True):
            data = TuiData(db, transient=transient)
            assert len(data.sessions()) == 3
            assert data.live
            data.close()
    finally:
        svc.stop()
        store.close()

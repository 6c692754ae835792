"""Flow files and HAR of healthy runs import in the order live capture saw, and diagnose clean.

Real processes throughout (``import_rig``): ``workbench sim`` upstream, mitmdump with the capture
addon and a whole-body flow writer, our client, then ``workbench import`` and ``workbench
diagnose`` on the files. Where the protocol determines the order (everything but heartbeats and
how far a stream_close trails its results), the imported session equals the live one frame by frame.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from import_rig import Recording, closes_follow_results, wire_view
from mitmproxy import http, io
from support import query_rows

from workbench.cli import main
from workbench.schema import pb
from workbench.wire.envelope import encode, split_frames

pytestmark = pytest.mark.slow  # every test uses the live recording (workbench sim, mitmdump, our client)


def _frames(db: Path, sid: str) -> list[dict[str, Any]]:
    return query_rows(db, "SELECT * FROM frames WHERE session_id = ? ORDER BY seq", [sid])


def _diagnose(db: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, list[str]]:
    capsys.readouterr()
    main(["diagnose", "--all", "--json", "--db", str(db)])
    out: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        doc = json.loads(line)
        out[doc["session_id"]] = sorted(f["code"] for f in doc.get("findings", []))
    return out


@pytest.mark.parametrize("source", ["flow", "har"])
def test_imports_match_the_live_capture(ingest_live: Recording, source: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert all(err is None for err in ingest_live.errors.values()), ingest_live.errors
    db = tmp_path / f"{source}.duckdb"
    file = ingest_live.flows if source == "flow" else ingest_live.har
    assert main(["import", str(file), "--db", str(db)]) == 0
    assert capsys.readouterr().out.startswith(f"imported {file}: {len(ingest_live.runs)} sessions")
    live_findings = _diagnose(ingest_live.live_db, capsys)
    imported_findings = _diagnose(db, capsys)
    sessions = {(r["request_id"], r["transport"]): r for r in query_rows(db, "SELECT * FROM sessions")}
    for (scenario, transport), rid in ingest_live.runs.items():
        s = sessions[(rid, transport)]
        meta = json.loads(s["meta"])
        assert (meta["order"], s["status"]) == ("causal", "complete"), (scenario, transport, meta.get("order_note"))
        live = _frames(ingest_live.live_db, rid)
        got = _frames(db, s["session_id"])
        assert len(got) == len(live), (scenario, transport)
        assert wire_view(got) == wire_view(live), (scenario, transport)
        assert closes_follow_results(got) and closes_follow_results(live)
        assert [r["seq"] for r in got] == list(range(len(got)))
        assert all(a["ts"] <= b["ts"] for a, b in zip(got, got[1:], strict=False))  # times never go back
        # the same rules on the same traffic agree, and healthy traffic is clean from every source
        assert imported_findings[s["session_id"]] == live_findings[rid] == [], (scenario, transport)
        statuses = []
        for r in got:
            fm = json.loads(r["meta"])
            assert isinstance(fm["body_index"], int)
            if r["transport"] == "bidi_append" and r["direction"] == "client":
                statuses.append((r["kind"], fm["http_status"]))
                assert fm["content_type"] == "application/proto"
                assert fm["request_headers"]["authorization"].startswith("Bearer [redacted sha256:")
        # every append was accepted, but for heartbeats sent as the run ended (404: no stream left)
        assert all(st == 200 or kind == "client_heartbeat" for kind, st in statuses), statuses
        assert bool(statuses) == (transport == "runsse")


def test_appends_saved_in_any_order_give_the_same_sessions(ingest_live: Recording, tmp_path: Path) -> None:
    with ingest_live.flows.open("rb") as fh:
        flows = list(io.FlowReader(fh).stream())
    assert sum(1 for f in flows if f.request.path.endswith("/BidiAppend")) > 20
    random.Random(7).shuffle(flows)
    shuffled = tmp_path / "shuffled.flows"
    with shuffled.open("wb") as fh:
        w = io.FlowWriter(fh)
        for f in flows:
            w.add(f)
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    assert main(["import", str(ingest_live.flows), "--db", str(a)]) == 0
    assert main(["import", str(shuffled), "--db", str(b)]) == 0
    cols = "session_id, seq, direction, transport, kind, payload, append_seqno, ts"
    assert query_rows(a, f"SELECT {cols} FROM frames ORDER BY session_id, seq") == \
        query_rows(b, f"SELECT {cols} FROM frames ORDER BY session_id, seq")


def _rewrite_client_body(flow: http.HTTPFlow, edit: Any) -> None:
    """Re-encode the Connect-enveloped request body of a bidi Run with each message passed through ``edit``."""
    out = b""
    for env in split_frames(flow.request.raw_content or b""):
        assert env.error is None
        msg = pb.AgentClientMessage.FromString(env.payload)
        edit(msg)
        out += encode(msg.SerializeToString(), flags=env.flags)
    flow.request.raw_content = out


def test_damaged_ids_keep_body_order(ingest_live: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rid = ingest_live.runs[("tool_flow", "run")]
    with ingest_live.flows.open("rb") as fh:
        (flow,) = [f for f in io.FlowReader(fh).stream()
                   if f.request.path.endswith("/Run") and f.request.headers.get("x-request-id") == rid]

    def answer_a_stranger(msg: Any) -> None:
        if msg.WhichOneof("message") == "exec_client_message" and msg.exec_client_message.id == 2:
            msg.exec_client_message.id = 99  # answers an exec the server never sent

    _rewrite_client_body(flow, answer_a_stranger)
    damaged = tmp_path / "damaged.flows"
    with damaged.open("wb") as fh:
        io.FlowWriter(fh).add(flow)
    db = tmp_path / "d.duckdb"
    assert main(["import", str(damaged), "--db", str(db)]) == 0
    (s,) = query_rows(db, "SELECT * FROM sessions")
    meta = json.loads(s["meta"])
    assert meta["order"] == "body" and "exec 99" in meta["order_note"] and "never asked" in meta["order_note"]
    rows = _frames(db, s["session_id"])
    directions = [r["direction"] for r in rows]
    n_client = directions.count("client")
    assert directions == ["client"] * n_client + ["server"] * (len(rows) - n_client)  # body order
    assert [json.loads(r["meta"])["body_index"] for r in rows] == list(range(len(rows)))
    # order-dependent rules see the body order; the session says so for them to qualify their verdicts
    assert main(["diagnose", "--all", "--db", str(db)]) in (0, 1)

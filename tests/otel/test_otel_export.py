"""``workbench export --otlp``: the demo's sessions as GenAI traces, as an OTLP/HTTP endpoint receives
them (decoded with ``opentelemetry-proto``), and the ways it fails."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import duckdb
import pytest
from conftest import bridge_db, wb
from otlp_receiver import attrs, otlp_receiver

from workbench.otel.spans import SCHEMA_URL, trace_id_of

pytestmark = [pytest.mark.xdist_group("otel"), pytest.mark.slow]


def _export(db: Path, url: str, *extra: str) -> dict:
    r = wb("export", "--otlp", url, "--db", str(db), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _sessions(db: Path) -> dict[str, dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT session_id, label, status, epoch_us(started_at) FROM sessions "
                           "WHERE status <> 'open'").fetchall()
        found = con.execute("SELECT session_id, code, severity FROM findings").fetchall()
    finally:
        con.close()
    out = {sid: {"label": label, "status": status, "start_us": start, "findings": []}
           for sid, label, status, start in rows}
    for sid, code, sev in found:
        if sid in out:
            out[sid]["findings"].append((code, sev))
    return out


def test_the_demo_becomes_one_genai_trace_per_session(demo_db: Path) -> None:
    sessions = _sessions(demo_db)
    with otlp_receiver() as (url, got):
        res = _export(demo_db, url)
    assert sorted(res["sessions"]) == sorted(sessions)
    assert res["spans"] == len(got.spans)
    roots = {attrs(s)["workbench.session_id"]: s for s in got.spans if not s.parent_span_id}
    assert sorted(roots) == sorted(sessions)
    for sid, root in roots.items():
        a = attrs(root)
        assert root.trace_id == trace_id_of(sid).to_bytes(16, "big")
        assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.provider.name"] == "cursor"
        assert root.name.startswith("invoke_agent")
        # the frames' own times: the trace starts when the session did
        assert root.start_time_unix_nano == sessions[sid]["start_us"] * 1000
        children = [s for s in got.spans if s.trace_id == root.trace_id and s.parent_span_id]
        assert all(s.parent_span_id == root.span_id for s in children)
        events = [(attrs(e)["workbench.finding.code"], attrs(e)["workbench.finding.severity"])
                  for s in [root, *children] for e in s.events if e.name == "workbench.finding"]
        assert sorted(events) == sorted(sessions[sid]["findings"])
        errors = [s for s in [root, *children] if s.status.code == 2]  # STATUS_CODE_ERROR
        assert bool(errors) == any(sev == "error" for _, sev in sessions[sid]["findings"]) or \
            sessions[sid]["status"] == "error"
        assert "gen_ai.input.messages" not in a  # content is opt-in
    assert {schema for _, schema in got.scopes} == {SCHEMA_URL}
    chats = got.named("chat")
    assert chats and all(attrs(s)["gen_ai.operation.name"] == "chat" and attrs(s)["gen_ai.request.stream"]
                         for s in chats)
    assert any("gen_ai.response.time_to_first_chunk" in attrs(s) for s in chats)
    tools = got.named("execute_tool")
    assert tools and all(attrs(s)["gen_ai.tool.name"] and attrs(s)["gen_ai.tool.call.id"] for s in tools)
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano for s in got.spans)
    # the heartbeat loop: its finding is an error event on the span it is about
    loop = [s for s in got.spans for e in s.events if attrs(e).get("workbench.finding.code") == "heartbeat_loop"]
    assert loop and all(s.status.code == 2 for s in loop)


def test_exporting_twice_gives_the_same_trace(demo_db: Path) -> None:
    with otlp_receiver() as (url, first):
        _export(demo_db, url)
    with otlp_receiver() as (url, second):
        _export(demo_db, url)
    ids = lambda got: sorted((s.trace_id, s.span_id, s.parent_span_id, s.name) for s in got.spans)  # noqa: E731
    assert ids(first) == ids(second) and len(first.spans) > 0


def test_content_only_with_content(demo_db: Path) -> None:
    with otlp_receiver() as (url, got):
        _export(demo_db, url, "--content")
    prompts = [json.loads(attrs(s)["gen_ai.input.messages"]) for s in got.spans
               if "gen_ai.input.messages" in attrs(s)]
    texts = [p["content"] for msgs in prompts for m in msgs for p in m["parts"]]
    assert any("Say hello to the workbench." in t for t in texts)
    assert any("gen_ai.tool.call.arguments" in attrs(s) for s in got.named("execute_tool"))


def test_a_bridge_request_links_to_the_run_it_caused(tmp_path: Path) -> None:
    db = bridge_db(tmp_path / "bridge.duckdb")
    with otlp_receiver() as (url, got):
        _export(db, url)
    roots = {attrs(s)["workbench.session_id"]: s for s in got.spans if not s.parent_span_id}
    o1, r1 = roots["o1"], roots["r1"]
    assert attrs(o1)["gen_ai.operation.name"] == "chat" and attrs(o1)["gen_ai.provider.name"] == "openai"
    assert attrs(o1)["gen_ai.request.stream"] is True
    assert attrs(o1)["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert attrs(o1)["gen_ai.response.time_to_first_chunk"] == pytest.approx(5.0, abs=0.01)
    assert (r1.trace_id, r1.span_id) in [(lk.trace_id, lk.span_id) for lk in o1.links]
    assert (o1.trace_id, o1.span_id) in [(lk.trace_id, lk.span_id) for lk in r1.links]
    assert json.loads(attrs(o1)["workbench.links"])  # the same, for backends that keep no links


def test_the_standard_environment_and_headers(demo_db: Path) -> None:
    with otlp_receiver() as (url, got):
        r = wb("export", "--otlp", "--db", str(demo_db), "--header", "authorization=Bearer test-only",
               env={"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_HEADERS": "x-team=wb"})
        assert r.returncode == 0, r.stderr
    assert got.spans and got.headers
    assert got.headers[0]["authorization"] == "Bearer test-only"
    with otlp_receiver() as (url, got):
        r = wb("export", "--otlp", "--db", str(demo_db), env={"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                                              "OTEL_EXPORTER_OTLP_HEADERS": "x-team=wb"})
        assert r.returncode == 0, r.stderr
    assert got.headers[0]["x-team"] == "wb"


def test_a_backend_that_is_down_or_refuses_is_exit_2(demo_db: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = wb("export", "--otlp", f"http://127.0.0.1:{port}", "--db", str(demo_db))
    assert r.returncode == 2 and f"127.0.0.1:{port}/v1/traces" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    with otlp_receiver() as (url, got):
        got.status = 401
        r = wb("export", "--otlp", url, "--db", str(demo_db))
    assert r.returncode == 2 and "401" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, named", [
    (["--otlp", "ftp://x"], "--otlp"),
    (["--otlp", "http://127.0.0.1:9", "--since", "last tuesday"], "--since"),
    (["--otlp", "http://127.0.0.1:9", "--header", "novalue"], "--header"),
    (["--parquet", "out", "--content"], "--otlp"),
])
def test_bad_options_are_exit_2_naming_them(tmp_path: Path, args: list[str], named: str) -> None:
    db = bridge_db(tmp_path / "b.duckdb")
    r = wb("export", *args, "--db", str(db))
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr

"""Issue 11, item 5: healthy traffic gives no finding from any source, for every client style we know.

Real processes throughout (``matrix_rig``): one ``workbench sim``, one mitmdump with the capture
addon and the whole-body flow writer (+ HAR through mitmproxy's own exporter), our client in both
close styles (recording itself) and the Node.js test client (never half-closing), each also as a
client that never answers request_context_args (its context in the run request, issue 21), run
concurrently through it; our client's turns are also printed as ``cursor-agent`` stream-json. Then
``workbench import`` of the flow file, the HAR and the stream-json, and ``workbench diagnose --all
--json`` on the five sources (live capture, flow, HAR, client recording, stream-json). Every
healthy (scenario, transport, style) cell has zero findings in each source that holds it; every
failure cell has its code in each source that can show it, with evidence frames.
The matrix with its counts is printed by ``test_matrix_table`` (whatever pytest's capture).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from matrix_rig import (
    CONTEXT_SCENARIOS,
    SOURCES,
    Cell,
    Matrix,
    failure_cells,
    healthy_cells,
    record_matrix,
    table,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("node") is None, reason="node (v20+) is not installed")]

HEALTHY = healthy_cells()
FAILURES = failure_cells()

# What a finding's evidence must show, per code: frames of these kinds (prefixes) among its seqs.
EVIDENCE = {
    "missing_stream_close": ("exec_server_message.", "exec_client_message.", "interaction_update.heartbeat"),
    "heartbeat_loop": ("interaction_update.heartbeat",),
    "kv_only_response": ("kv_server_message.set_blob_args", "interaction_update.heartbeat"),
    "args_cumulative_snapshots": ("interaction_update.partial_tool_call", "exec_client_message.mcp_result"),
    "append_seqno_anomaly": ("run_request",),
    "stream_ended_without_turn_end": ("run_request",),
    "missing_conversation_state": ("run_request", "end_stream.error"),
    "tool_loop": ("exec_server_message.shell_args", "exec_client_message.shell_result"),
    "unanswered_exec": ("exec_server_message.shell_args", "interaction_update.heartbeat"),
    "server_error": ("end_stream.error",),
}
# The same in a stream-json recording (the CLI's events, no wire).
EVIDENCE_STREAM_JSON = {
    "tool_loop": ("tool_call.started", "tool_call.completed"),
    "server_error": ("result.error",),
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    return record_matrix(tmp_path_factory.mktemp("matrix"), HEALTHY + FAILURES)


def _cells(cells: list[Cell]) -> list[Any]:
    return [pytest.param(c, s, id=f"{c.name}/{s}") for c in cells for s in c.sources]


def _messages(m: Matrix, cell: Cell, source: str) -> list[str]:
    return [f"{f['code']} [{f['severity']}] {f['message'][:300]}" for _s, f in m.findings(cell, source)]


@pytest.mark.parametrize(("cell", "source"), _cells(HEALTHY))
def test_healthy_cell_has_no_finding(matrix: Matrix, cell: Cell, source: str) -> None:
    assert matrix.outcomes[cell] == [None], f"the client's turn did not complete: {matrix.outcomes[cell]}"
    [session] = matrix.sessions(cell, source)
    assert session is not None, f"no {cell.transport} session for request {matrix.rids[cell]} in the {source} source"
    assert matrix.codes(cell, source) == [], _messages(matrix, cell, source)
    frames = matrix.sources[source].frames[session["session_id"]]
    kinds = {f["kind"] for f in frames.values()}
    if source == "stream-json":  # the CLI's account of the turn: it ended well
        assert session["status"] == "complete"
        assert "result.success" in kinds
        return
    assert len(frames) > 10
    assert "interaction_update.turn_ended" in kinds
    if source in ("flow", "har"):  # judged like a capture only because the interleaving was rebuilt
        assert session["meta"]["order"] == "causal", session["meta"].get("order_note")


@pytest.mark.parametrize(("cell", "source"), _cells(FAILURES))
def test_failure_cell_has_its_code_with_evidence(matrix: Matrix, cell: Cell, source: str) -> None:
    assert matrix.recorded(cell, source), f"a run of request(s) {matrix.rids[cell]} is missing from {source}"
    codes = matrix.codes(cell, source)
    assert cell.expect in codes, (codes, _messages(matrix, cell, source))
    assert set(cell.also) <= set(codes), (codes, _messages(matrix, cell, source))
    for session, f in matrix.findings(cell, source):
        if f["code"] not in (cell.expect, *cell.also):
            continue
        frames = matrix.sources[source].frames[session["session_id"]]
        assert f["evidence"], f["code"]
        assert set(f["evidence"]) <= set(frames), (f["code"], f["evidence"])
        kinds = {frames[e]["kind"] for e in f["evidence"]}
        for want in (EVIDENCE_STREAM_JSON if source == "stream-json" else EVIDENCE)[f["code"]]:
            assert any(k.startswith(want) for k in kinds), (f["code"], want, sorted(kinds))
        if f["code"] == "append_seqno_anomaly":  # two client appends under one seqno
            seqnos = [frames[e]["append_seqno"] for e in f["evidence"]
                      if frames[e]["transport"] == "bidi_append" and frames[e]["direction"] == "client"]
            assert len(seqnos) >= 2, seqnos
            assert len(set(seqnos)) < len(seqnos), seqnos


NO_CONTEXT_CELLS = [c for c in HEALTHY if c.scenario in CONTEXT_SCENARIOS and not c.answers_context]


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.name) for c in NO_CONTEXT_CELLS])
def test_no_context_client_left_request_context_unanswered(matrix: Matrix, cell: Cell) -> None:
    """Issue 21: these turns completed (above) although the client never answered request_context_args;
    the Node client's tool calls went to the tool its run request offered."""
    [session] = matrix.sessions(cell, "live")
    assert session is not None
    kinds = [f["kind"] for f in matrix.sources["live"].frames[session["session_id"]].values()]
    assert "exec_server_message.request_context_args" in kinds
    assert not any(k.startswith("exec_client_message.request_context_result") for k in kinds)
    assert "interaction_update.turn_ended" in kinds
    if cell.node:
        assert "exec_server_message.mcp_args" in kinds


def test_matrix_table(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """Every session of every source belongs to a cell: the counts of the table are the whole story."""
    with capsys.disabled():
        print("\n" + table(matrix))
    for source in SOURCES:
        fixed = matrix.sources[source].transport
        mine = {(rid, fixed or c.transport) for c in matrix.cells if source in c.sources for rid in matrix.rids[c]}
        sessions = matrix.sources[source].sessions
        strays = [s for s in sessions if (s["request_id"], s["transport"]) not in mine]
        assert strays == [], (source, [(s["transport"], s["request_id"], s["status"]) for s in strays])
        assert len(sessions) == len(mine), source

"""Live capture and flow-file import give the same session status for the same bytes.

Real processes throughout: a scripted HTTP/2 server (``ending_server.py``) ends one bidi ``Run``
per way a response can end; an HTTP/2 client sends each request through one mitmdump running the
capture addon (the live recording) and ``tests/ingest/data/whole_body_flows.py`` (the same
exchanges saved with mitmproxy's own ``io.FlowWriter``, whole bodies); then ``workbench import``
reads the flow file into a second database. Every ending must give the status the protocol says
(``workbench.protocol.status``), and the same status, error text and reset facts both ways.
1xx responses are not in the matrix: mitmproxy neither forwards nor records an informational
response (HTTP/2 carries it before the final one), so no recording can hold one as final.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from ending_server import ENDINGS, EndingServer
from support import free_port, query_rows, stop_popen, wait_port

from workbench.cli import main
from workbench.schema import pb
from workbench.store import open_reader
from workbench.wire.envelope import encode

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CAPTURE_ADDON = ROOT / "addons" / "cursor_capture.py"
WHOLE_BODY_ADDON = ROOT / "tests" / "ingest" / "data" / "whole_body_flows.py"
RUN_PATH = "/agent.v1.AgentService/Run"

pytestmark = pytest.mark.slow


def _run_request(prompt: str) -> bytes:
    return encode(pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=prompt))),
        requested_model=pb.RequestedModel(model_id="status-model"),
        conversation_id=str(uuid.uuid4()))).SerializeToString())


def _sessions(db: Path) -> dict[str, dict[str, Any]]:
    r = open_reader(db)
    try:
        rows = r.query("SELECT request_id, status, error, http_status, model, meta FROM sessions").to_pylist()
    finally:
        r.close()
    return {row["request_id"]: row for row in rows}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path, Path]:
    """(ending → request id, live database, flow file): every ending sent once through mitmdump."""
    out = tmp_path_factory.mktemp("status-endings")
    server = EndingServer(out / "certs")
    live_db, flows = out / "live.duckdb", out / "whole.flows"
    port = free_port()
    confdir = out / "mitm-conf"
    log = (out / "mitmdump.log").open("w")
    mitm = subprocess.Popen(
        [str(BIN / "mitmdump"), "-q", "-s", str(CAPTURE_ADDON), "-s", str(WHOLE_BODY_ADDON),
         "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
         "--set", "ssl_insecure=true", "--set", f"cursor_db={live_db}", "--set", f"whole_body_flows={flows}"],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    rids: dict[str, str] = {}
    try:
        wait_port(port, mitm)
        ctx = ssl.create_default_context(cafile=str(confdir / "mitmproxy-ca-cert.pem"))
        with httpx.Client(http2=True, proxy=f"http://127.0.0.1:{port}", verify=ctx, trust_env=False,
                          timeout=60) as client:
            for ending, (ctype, _) in ENDINGS.items():
                rid = str(uuid.uuid4())
                rids[ending] = rid
                headers = {"content-type": ctype, "x-request-id": rid, "x-test-ending": ending,
                           "authorization": "Bearer status-test-token", "te": "trailers"}
                try:
                    with client.stream("POST", server.url + RUN_PATH, content=_run_request(ending),
                                       headers=headers) as resp:
                        resp.read()
                except httpx.HTTPError:
                    assert ending == "reset", f"{ending}: the request failed"
    finally:
        stop_popen(mitm, signal.SIGINT, 90)
        server.close()
    assert sorted(server.answered) == sorted(ENDINGS)
    return rids, live_db, flows


def test_every_ending_gets_the_same_status_live_and_imported(recorded: tuple[dict[str, str], Path, Path],
                                                             tmp_path: Path) -> None:
    rids, live_db, flows = recorded
    imported_db = tmp_path / "imported.duckdb"
    assert main(["import", str(flows), "--db", str(imported_db)]) == 0
    live, imported = _sessions(live_db), _sessions(imported_db)
    got = {}
    for ending, rid in rids.items():
        a, b = live[rid], imported[rid]
        got[ending] = (a["status"], b["status"])
        assert a["error"] == b["error"], ending
        assert a["http_status"] == b["http_status"], ending
        assert a["model"] == b["model"] == "status-model", ending
    assert got == {ending: (expected, expected) for ending, (_, expected) in ENDINGS.items()}


def test_a_reset_keeps_its_side_and_code_both_ways(recorded: tuple[dict[str, str], Path, Path],
                                                    tmp_path: Path) -> None:
    rids, live_db, flows = recorded
    imported_db = tmp_path / "imported.duckdb"
    assert main(["import", str(flows), "--db", str(imported_db)]) == 0
    rid = rids["reset"]
    live_reset = json.loads(_sessions(live_db)[rid]["meta"])["reset"]
    imported_reset = json.loads(_sessions(imported_db)[rid]["meta"])["reset"]
    assert live_reset == imported_reset
    assert (live_reset["side"], live_reset["code"]) == ("server", "INTERNAL_ERROR")
    assert _sessions(live_db)[rid]["error"] == "stream reset by server (INTERNAL_ERROR)"


def test_the_flow_file_holds_the_same_bytes(recorded: tuple[dict[str, str], Path, Path]) -> None:
    """The equivalence means something only if both recordings saw the same bodies."""
    from mitmproxy import io

    rids, live_db, flows = recorded
    with flows.open("rb") as fh:
        saved = {f.request.headers.get("x-request-id"): f for f in io.FlowReader(fh).stream()}
    rows = query_rows(live_db, "SELECT session_id, direction, kind, payload FROM frames WHERE direction = 'server' "
                      "AND kind = 'interaction_update.text_delta' ORDER BY session_id, seq")
    with_text = {row["session_id"] for row in rows}
    for ending, rid in rids.items():
        flow = saved[rid]
        body = flow.response.raw_content if flow.response is not None else None
        carries_text = bool(body) and b"scripted answer" in body
        assert carries_text == (rid in with_text), ending
    assert os.path.getsize(flows) > 0

"""The HTML report shows a capture's control, bidi and zero-width characters as visible escapes
(issue 35): autoescape keeps wire text from being markup, and U+202E in a tool name or label
cannot make it read as another on the page."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from workbench.cli import main
from workbench.decode.classify import default_decoder
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.tui.sample_db import BASE_US, _client, _record, _server

TOOL = "read_file\u202etxt.exe\u200b"
PROMPT = "run \x1b]0;pwned\x07 now"


def test_report_shows_spoofing_characters_escaped(tmp_path: Path) -> None:
    db, out = tmp_path / "c.duckdb", tmp_path / "r.html"
    mcp = pb.McpArgs(name=TOOL, tool_name=TOOL, tool_call_id="call-1")
    turn = [
        (0.0, "client", _client(run_request=pb.AgentRunRequest(action=pb.ConversationAction(
            user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text=PROMPT, message_id="m")))))),
        (0.1, "server", _server(interaction_update=pb.InteractionUpdate(tool_call_started=pb.ToolCallStarted(
            call_id="call-1", tool_call=pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=mcp)))))),
        (0.2, "server", _server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", mcp_args=mcp))),
    ]
    with Store(db) as store:
        rec = Recorder(store)
        _record(rec, default_decoder(), SessionInfo("report-hostile", source="capture", transport="run",
                                                    status="complete", model=TOOL), iter(turn), BASE_US)
        rec.flush()
    assert main(["report", "report-hostile", "--db", str(db), "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    raw = sorted({repr(c) for c in html if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs")})
    assert not raw, f"the report holds raw {raw}"
    assert "read_file\\u202etxt.exe\\u200b" in html
    assert "\\x1b]0;pwned\\x07" in html

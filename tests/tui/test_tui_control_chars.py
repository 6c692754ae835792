"""Control characters from a capture are shown as visible escapes in the TUI (issue 35).

A crafted capture puts terminal control sequences and a right-to-left override in the strings the
TUI shows: the session's label and model, a text delta, a tool call's id and name, and an OpenAI
stream's content. Under Pilot the real app puts none of them raw on screen (a Rich segment goes to
the terminal as it is), and shows each escaped the way ``workbench`` commands print it
(``workbench.textsafe``). The OpenAI side's summary escapes a newline once, as the agent side's.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.strip import Strip
from textual.widgets import DataTable

from workbench.analysis import analyze
from workbench.decode.classify import default_decoder
from workbench.decode.openai import decode_openai_body
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.textsafe import escape
from workbench.tui.app import WorkbenchApp
from workbench.tui.sample_db import BASE_US, _client, _record, _server
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen
from workbench.tui.timeline import Timeline

Wait = Callable[..., Any]
TITLE = "\x1b]0;pwned\x07"
TOOL = "read_file\u202e\x9b2J"   # reads as another name; the C1 CSI clears the screen
AGENT = "run-hostile-tui"
OPENAI = "openai-hostile-tui"


def _turn() -> Iterator[tuple[float, str, bytes]]:
    yield 0.0, "client", _client(run_request=pb.AgentRunRequest(
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=f"prompt {TITLE}", message_id="m1"))),
        conversation_id="c0ffee00-0000-4000-8000-00000000000b"))
    yield 0.1, "server", _server(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="README.md\nsrc \x1b[2J C:\\dir")))
    mcp = pb.McpArgs(name=TOOL, tool_name=TOOL, tool_call_id=f"call-{TITLE}")
    yield 0.2, "server", _server(interaction_update=pb.InteractionUpdate(tool_call_started=pb.ToolCallStarted(
        call_id=f"call-{TITLE}", tool_call=pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=mcp)))))
    yield 0.3, "server", _server(interaction_update=pb.InteractionUpdate(tool_call_completed=pb.ToolCallCompleted(
        call_id=f"call-{TITLE}", tool_call=pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=mcp)))))


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("controls") / "hostile.duckdb"
    sse = b"data: " + json.dumps({"choices": [{"delta": {"content": "README.md\nsrc"}}]}).encode() + b"\n\n"
    with Store(db) as store:
        rec = Recorder(store)
        _record(rec, default_decoder(), SessionInfo(AGENT, source="capture", transport="run", status="complete",
                                                    model=f"model {TITLE}"), _turn(), BASE_US)
        rec.open_session(SessionInfo(OPENAI, source="capture", transport="openai_chat", status="complete"))
        for i, f in enumerate(decode_openai_body(sse, "server")):
            rec.add(OPENAI, BASE_US + i, "server", "openai_chat", "1", f)
        rec.flush()
        analyze(store)
        (name,) = store.query("SELECT tool_name FROM tool_calls").column(0).to_pylist()
        assert name == TOOL  # the capture's string reached the table the TUI reads
    return db


def _screen(app: WorkbenchApp) -> str:
    strips: list[Strip] = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


def _raw(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")})


async def _open(app: WorkbenchApp, pilot: Any, wait_for: Wait, session: str) -> None:
    await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen)
                   and app.screen.query_one("#sessions", DataTable).row_count == 2, what="sessions list")
    table = app.screen.query_one("#sessions", DataTable)
    row = next(i for i, key in enumerate(table.rows) if key.value == session)
    table.move_cursor(row=row)
    await pilot.pause()
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, SessionScreen)
                   and app.screen.query_one("#timeline", Timeline).first_paint is not None
                   and app.screen.side_ready, what="session")


async def test_hostile_names_are_shown_escaped(hostile_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(hostile_db)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen)
                       and app.screen.query_one("#sessions", DataTable).row_count == 2, what="sessions list")
        await pilot.pause()
        text = _screen(app)
        assert not _raw(text), f"the sessions list put {_raw(text)} on screen:\n{text}"
        assert escape(f"prompt {TITLE}") in text, text
        await _open(app, pilot, wait_for, AGENT)
        await pilot.press("c")  # the tool calls panel
        await wait_for(pilot, lambda: app.screen.query_one("#tools-table", DataTable).row_count == 1, what="tools")
        await pilot.pause()
        text = _screen(app)
        assert not _raw(text), f"the session screen put {_raw(text)} on screen:\n{text}"
        assert escape(TOOL) in text, f"the tool name is not shown escaped:\n{text}"
        assert escape(f"call-{TITLE}")[:14] in text, text
        # quote() escaped the newline and the backslash once; the store's rule and the printer add none
        assert 'text "README.md\\nsrc \\x1b[2J C:\\\\dir"' in text, text


async def test_openai_summary_escapes_a_newline_once(hostile_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(hostile_db)
    async with app.run_test(size=(200, 50)) as pilot:
        await _open(app, pilot, wait_for, OPENAI)
        await pilot.pause()
        text = _screen(app)
        assert 'content "README.md\\nsrc"' in text, text
        assert "README.md\\\\nsrc" not in text, text

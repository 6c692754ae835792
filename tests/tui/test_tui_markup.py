"""Strings from a capture are shown as text, never as markup (issue 20, finding 11).

A crafted capture puts Rich/Textual markup in every string it controls: the session id, the
prompt (the session's label), a KV blob's role, its content and a frame's error. Under Pilot the
real app shows each literally and puts no action (``@click``) on screen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.strip import Strip
from textual.widgets import DataTable

from workbench.analysis import analyze
from workbench.decode.classify import default_decoder
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.tui.app import WorkbenchApp
from workbench.tui.modals import BlobScreen
from workbench.tui.sample_db import BASE_US, _client, _record, _server
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen
from workbench.tui.timeline import Timeline

Wait = Callable[..., Any]
CLICK = "[@click=app.quit]x[/]"
SESSION = f"run-{CLICK}"
ROLE = f"{CLICK}[@click=app.bell]y[/]"


def _turn() -> Iterator[tuple[float, str, bytes]]:
    yield 0.0, "client", _client(run_request=pb.AgentRunRequest(
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=f"prompt {CLICK}", message_id="m1"))),
        conversation_id="c0ffee00-0000-4000-8000-00000000000a"))
    blob = json.dumps({"role": ROLE, "content": f"content {CLICK}"}).encode()
    yield 0.1, "server", _server(kv_server_message=pb.KvServerMessage(
        id=1, set_blob_args=pb.SetBlobArgs(blob_id=hashlib.sha256(blob).digest(), blob_data=blob)))
    yield 0.2, "client", _client(kv_client_message=pb.KvClientMessage(id=1, set_blob_result=pb.SetBlobResult()))


@pytest.fixture(scope="module")
def crafted_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("markup") / "crafted.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        _record(rec, default_decoder(), SessionInfo(SESSION, source="capture", transport="run", status="error",
                                                    error=f"error {CLICK}", model=CLICK), _turn(), BASE_US)
        rec.flush()
        analyze(store)
        (role,) = store.query("SELECT role FROM blobs").column(0).to_pylist()
        assert role == ROLE  # the capture's string reached the table the modal reads
    return db


def _screen(app: WorkbenchApp) -> tuple[str, list[str]]:
    """What the screen shows, as text, and every click action a segment on it carries."""
    strips: list[Strip] = app.screen._compositor.render_strips()
    text = "\n".join("".join(seg.text for seg in strip) for strip in strips)
    actions = [str(seg.style.meta.get("@click")) for strip in strips for seg in strip
               if seg.style is not None and seg.style.meta and "@click" in seg.style.meta]
    return text, actions


async def test_capture_strings_are_shown_literally(crafted_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(crafted_db)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen)
                       and app.screen.query_one("#sessions", DataTable).row_count == 1, what="sessions list")
        await pilot.pause()
        text, actions = _screen(app)
        assert actions == [] and f"prompt {CLICK}" in text, (actions, text)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionScreen)
                       and app.screen.query_one("#timeline", Timeline).first_paint is not None
                       and app.screen.side_ready, what="session")
        await wait_for(pilot, lambda: app.screen.query_one("#blobs-table", DataTable).row_count == 1, what="blobs")
        await pilot.pause()
        text, actions = _screen(app)
        assert actions == [] and SESSION in text, (actions, text)
        await pilot.press("b", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, BlobScreen), what="blob screen")
        await pilot.pause()
        text, actions = _screen(app)
        # a click on the role's first cell: had the role been markup, this is the link that quits
        y, line = next((y, ln) for y, ln in enumerate(text.splitlines()) if "role / type" in ln)
        x = line.index("role / type") + len("role / type")
        x += len(line[x:]) - len(line[x:].lstrip())
        await pilot.click(offset=(x, y))
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, BlobScreen), "a capture string quit the app"
        assert actions == [], actions
        assert f"{ROLE} / json" in text, text
        assert f"content {CLICK}" in text, text

"""The notebook helpers' tables to look at (``workbench.notebook.printable``): a capture's control
characters are shown escaped, in the printed table and in its HTML; the data stays exact (issue 35)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from workbench.decode.classify import default_decoder
from workbench.notebook import connect, printable, session_overview
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.textsafe import escape
from workbench.tui.sample_db import BASE_US, _client, _record

LABEL = "fix \x1b]0;pwned\x07 read_file\u202etxt.exe \x9b2J"


def _raw(text: str) -> list[str]:
    return sorted({repr(c) for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs")})


def test_printable_overview_shows_control_characters_escaped(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    turn = [(0.0, "client", _client(run_request=pb.AgentRunRequest(action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text=LABEL, message_id="m")))))),
    ]
    with Store(db) as store:
        rec = Recorder(store)
        _record(rec, default_decoder(), SessionInfo("nb-hostile", source="capture", transport="run",
                                                    status="complete", model=LABEL), iter(turn), BASE_US)
        rec.flush()
    con = connect(db)
    try:
        df = session_overview(con)
    finally:
        con.close()
    assert LABEL in df.label.iloc[0]  # the data is exact
    shown = printable(df)
    for text in (shown.to_string(), shown.to_html()):
        assert not _raw(text), f"{_raw(text)} in the table:\n{text}"
    assert escape(LABEL)[:30] in shown.label.iloc[0]
    assert _raw(df.to_string()), "the unescaped table holds the raw characters (else this test proves nothing)"

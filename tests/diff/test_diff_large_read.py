"""A session whose frames are larger than the reader's result cap is still read whole for a diff
(issue 35: `workbench diff` of a 1M-frame session stopped with "result larger than the 256 MiB cap"):
the read goes a page at a time, each page under the cap. Real DuckDB file, real reader, the cap
lowered so that a small session is over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.decode.classify import SERVER_MSG, default_decoder
from workbench.report.session import load_session
from workbench.schema import pb
from workbench.sessiondiff.compare import diff_sessions
from workbench.store import queries
from workbench.store.db import SessionInfo, Store
from workbench.store.reader import open_reader
from workbench.store.readonly import ReadLimits, ResultTooLarge
from workbench.store.recorder import Recorder


def _record(db: Path, sid: str, n: int) -> None:
    dec = default_decoder()
    with Store(db) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo(sid, source="test", transport="run", status="complete"))
        for i in range(n):
            msg = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
                text_delta=pb.TextDelta(text=f"word {i} " + "x" * 2000)))
            rec.add(sid, 1_750_000_000_000_000 + i * 1000, "server", "run", "1",
                    dec.classify_agent(msg.SerializeToString(), SERVER_MSG))
        rec.flush()


def test_a_session_over_the_result_cap_is_read_page_by_page(tmp_path: Path) -> None:
    db = tmp_path / "big.duckdb"
    _record(db, "s", 3000)   # ~6 MB of payloads
    cap = ReadLimits(max_result_bytes=1_000_000)
    reader = open_reader(db, cap)
    try:
        with pytest.raises(ResultTooLarge):   # one read of the whole session is over the cap
            reader.rows("SELECT payload FROM frames WHERE session_id = 's'")
        rows = queries.frames_shown_whole(reader, "s")
        assert [r["seq"] for r in rows] == list(range(3000))
        view = load_session(reader, "s", analyse=False)
    finally:
        reader.close()
    assert len(view.frames) == 3000
    assert diff_sessions(view, view).same

"""OpenAI-side frame summaries quote text the way the agent side's do: a newline escaped once
(issue 35: ``"README.md\\\\nsrc"`` on the OpenAI side, ``"README.md\\nsrc"`` on the run side)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.decode.classify import default_decoder
from workbench.decode.openai import decode_openai_body, event_frame, request_frame
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.wire.envelope import encode

TEXT = 'README.md\nsrc "x" \\ y'


def _agent_summary(text: str) -> str:
    msg = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text=text)))
    (f,) = default_decoder().decode_body(encode(msg.SerializeToString()), "run", "server")
    return f.summary


def test_openai_and_agent_summaries_quote_alike() -> None:
    agent = _agent_summary(TEXT)
    assert agent == 'text "README.md\\nsrc \\"x\\" \\\\ y"'
    content = event_frame(json.dumps({"choices": [{"delta": {"content": TEXT}}]}).encode()).summary
    assert content == agent.replace("text ", "content ", 1)
    req = request_frame(json.dumps({"model": "m", "messages": [{"role": "user", "content": TEXT}]}).encode())
    assert req.summary.endswith('last user: "README.md\\nsrc \\"x\\" \\\\ y"'), req.summary
    long = event_frame(json.dumps({"choices": [{"delta": {"content": "x" * 100}}]}).encode()).summary
    assert long == 'content "' + "x" * 60 + '…"'  # 60 characters kept, as before


def test_frames_prints_summaries_escaped_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides, a newline and a backslash: as the summary wrote them (the store's wire-text rule
    doubles every backslash of a text holding ``\\\\``; frames shows the text it stands for)."""
    db = tmp_path / "c.duckdb"
    sse = b"".join(b"data: " + json.dumps({"choices": [{"delta": {"content": t}}]}).encode() + b"\n\n"
                   for t in ("README.md\nsrc", "C:\\dir"))
    agent = [pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text=t)))
             for t in ("README.md\nsrc", "C:\\dir")]
    with Store(db) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo("oa-1", source="capture", transport="openai_chat", status="complete"))
        for i, f in enumerate(decode_openai_body(sse, "server")):
            rec.add("oa-1", 1_700_000_000_000_000 + i, "server", "openai_chat", "1", f)
        rec.open_session(SessionInfo("run-1", source="capture", transport="run", status="complete"))
        for i, m in enumerate(agent):
            (f,) = default_decoder().decode_body(encode(m.SerializeToString()), "run", "server")
            rec.add("run-1", 1_700_000_000_000_000 + i, "server", "run", "1", f)
        rec.flush()
    assert main(["frames", "oa-1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert main(["frames", "run-1", "--db", str(db)]) == 0
    run = capsys.readouterr().out
    for label, text in (("content", out), ("text", run)):
        assert f'{label} "README.md\\nsrc"' in text, text
        assert f'{label} "C:\\\\dir"' in text, text   # quote()'s one escape of the backslash
        assert "\\\\n" not in text and "\\\\\\" not in text, text

"""``workbench.protocol.labels``: what a session is called in lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.protocol.labels import LABEL_MAX, fill_label, prompt_label, prompt_of
from workbench.redact import marker
from workbench.schema import pb
from workbench.store.db import SessionInfo
from workbench.store.reader import open_reader

ROOT = Path(__file__).resolve().parents[2]


def test_scenario_marker_wins_over_the_prompt_text() -> None:
    assert prompt_label("[scenario:stream_close_stall] List the files here.") == "stream_close_stall"
    assert prompt_label("please [scenario:rate_limit] now") == "rate_limit"


def test_excerpt_is_one_line_and_short() -> None:
    assert prompt_label("  Fix the\n\tflaky   test ") == "Fix the flaky test"
    long = "word " * 40
    label = prompt_label(long)
    assert label is not None and len(label) == LABEL_MAX and label.endswith("…")


def test_no_label_for_empty_or_redacted_prompts() -> None:
    assert prompt_label(None) is None and prompt_label("  \n") is None
    assert prompt_label(marker("a secret prompt")) is None


@given(st.text(max_size=300))
def test_any_prompt_gives_a_short_single_line_label_or_none(text: str) -> None:
    label = prompt_label(text)
    assert label is None or (0 < len(label) <= LABEL_MAX and "\n" not in label)


def test_fill_label_reads_run_requests_and_follow_ups_and_keeps_the_first() -> None:
    run = pb.AgentClientMessage(run_request=pb.AgentRunRequest(action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text="first prompt")))))
    follow = pb.AgentClientMessage(conversation_action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text="second prompt"))))
    assert prompt_of("run_request", run.SerializeToString()) == "first prompt"
    assert prompt_of("conversation_action.user_message_action", follow.SerializeToString()) == "second prompt"
    assert prompt_of("run_request", b"\xff\xff") is None
    info = SessionInfo("s")
    assert fill_label(info, kind="run_request", payload=run.SerializeToString())
    assert not fill_label(info, kind="conversation_action.user_message_action", payload=follow.SerializeToString())
    assert info.label == "first prompt"


@pytest.mark.slow
def test_stream_json_import_is_labelled_with_the_first_user_prompt(tmp_path: Path) -> None:
    db = tmp_path / "ndjson.duckdb"
    exe = Path(sys.executable).parent / "workbench"
    r = subprocess.run([str(exe), "import", str(ROOT / "captures" / "samples" / "cli-stream-json.ndjson"),
                        "--db", str(db)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    reader = open_reader(db)
    try:
        labels = reader.query("SELECT label FROM sessions").column(0).to_pylist()
    finally:
        reader.close()
    assert labels == ["Why does tests/test_cart.py fail? Run it and check the conf…"]

"""The failures bridge authors reported (issue 33), live: the simulator's scenarios for them, our
client on the misbehaving side (``retry_after_turn``, ``watchdog``, the faults), captured through a
real mitmdump (``workbench capture``) and diagnosed; each beside its healthy twin. The same rules
are tested from imported flow files in ``test_analysis_client_failures.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from analysis_rig import workbench_capture as capture

from workbench.analysis import analyze
from workbench.client.agent import AgentClient
from workbench.sim.runner import running_sim
from workbench.store.db import Store

pytestmark = pytest.mark.slow  # starts mitmdump and the simulator

BIN = Path(sys.executable).parent


def findings_by_conversation(db: Path) -> dict[str, list[list[Any]]]:
    """conversation_id -> per session of it (in start order) its findings and notes."""
    store = Store(db)
    try:
        results = analyze(store)
        rows = store.query("SELECT session_id, conversation_id FROM sessions WHERE transport <> 'bidi_append' "
                           "ORDER BY started_at").to_pylist()
    finally:
        store.close()
    out: dict[str, list[list[Any]]] = {}
    for r in rows:
        if r["conversation_id"] and r["session_id"] in results:
            out.setdefault(r["conversation_id"], []).append(results[r["session_id"]].findings)
    return out


def problems(findings: list[Any]) -> list[str]:
    return sorted(f.code for f in findings if not f.is_note)


def notes(findings: list[Any]) -> list[str]:
    return sorted(f.code for f in findings if f.is_note)


async def test_retries_framing_unknown_exec_held_open_and_the_kept_ones_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    turns = {  # name -> (prompt, client options)
        "retried": ("[scenario:reset_after_turn] what is the answer?", {"retry_after_turn": 1}),
        "reset_no_retry": ("[scenario:reset_after_turn] once", {}),
        "goaway_no_retry": ("[scenario:goaway_after_turn] once", {}),
        "held_open": ("[scenario:held_open_after_turn] hi", {}),
        "bad_prefix": ("[scenario:bad_length_prefix] hi", {}),
        "unknown_ignored": ("[scenario:unknown_exec_case] hi", {"faults": ["ignore_unknown_exec"],
                                                                "heartbeat_budget": 6}),
        "unknown_thrown": ("[scenario:unknown_exec_case] hi", {}),
        "empty_blob": ("[scenario:empty_blob_answer] hi", {"faults": ["forget_blobs"]}),
        "blob_kept": ("[scenario:empty_blob_answer] hi", {}),
        "args_in_started": ("[scenario:args_in_started] hi", {}),
        "http_error": ("[scenario:run_http_error] hi", {}),
    }
    conv: dict[str, str] = {}
    async with capture(tmp_path, monkeypatch) as (ca, db):
        async with running_sim(heartbeat_interval=0.05, park_timeout=3.0, cert_dir=tmp_path / "cert") as sim:
            for name, (prompt, kw) in turns.items():
                async with AgentClient(sim.url, "t", verify=str(ca), heartbeat_interval=0.1, **kw) as c:
                    res = await c.run_turn(prompt, raise_on_error=False)
                conv[name] = res.conversation_id
    by_conv = findings_by_conversation(db)
    got = {name: by_conv.get(cid, []) for name, cid in conv.items()}
    # a reset after turn_ended, the same message sent again
    first, again = got["retried"]
    assert problems(first) == ["retried_turn"] and problems(again) == [], got["retried"]
    (f,) = [x for x in first if x.code == "retried_turn"]
    assert "RST_STREAM (INTERNAL_ERROR) from the server" in f.message and "once" in f.message
    # the healthy twin: the reset did no harm
    (only,) = got["reset_no_retry"]
    assert problems(only) == [] and notes(only) == ["transport_error_after_turn"]
    # (a GOAWAY reaches the proxy, not a client behind it: the retry after one is tested from a
    # flow file, test_analysis_client_failures.py)
    (only,) = got["goaway_no_retry"]
    assert problems(only) == [], only
    (held,) = got["held_open"]
    assert problems(held) == [] and notes(held) == ["stream_held_open"]
    (bad,) = got["bad_prefix"]
    assert problems(bad)[:1] == ["framing_lost"] or "framing_lost" in problems(bad), bad
    (lost,) = [x for x in bad if x.code == "framing_lost"]
    assert "unreadable here, not missing" in lost.message and "stream_ended_without_turn_end" not in problems(bad)
    (ignored,) = got["unknown_ignored"]
    # the client gave up (heartbeat budget) on a stall it caused: the exec is the root, not the reset
    assert "client_cancelled" not in problems(ignored)
    (ue,) = [x for x in ignored if x.code == "unanswered_exec"]
    assert ue.cause is None, ignored
    assert "field 56 of ExecServerMessage" in ue.message and "throw" in ue.suggested_fix
    (thrown,) = got["unknown_thrown"]
    assert problems(thrown) == []
    (empty,) = got["empty_blob"]
    assert problems(empty) == ["blob_miss"]
    (kept,) = got["blob_kept"]
    assert problems(kept) == []
    (started,) = got["args_in_started"]
    assert problems(started) == []
    (http,) = got["http_error"]
    assert problems(http) == ["server_error"]


@pytest.mark.parametrize(("action", "transport"), [("cancel", "run"), ("reset", "run"), ("disconnect", "run"),
                                                   ("cancel", "runsse"), ("disconnect", "runsse")])
async def test_a_watchdog_cutting_a_long_exec_is_client_cancelled_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str, transport: str) -> None:
    kw: dict[str, Any] = {"execute_locally": True, "workspace": tmp_path, "allow_shell": True,
                          "transport": transport}
    async with capture(tmp_path, monkeypatch) as (ca, db):
        # a command far longer than the watchdog: the cut does not depend on the machine's load
        async with running_sim(heartbeat_interval=0.1, long_exec_seconds=60, cert_dir=tmp_path / "cert") as sim:
            async with AgentClient(sim.url, "t", verify=str(ca), heartbeat_interval=0.1, watchdog=2.0,
                                   watchdog_action=action, **kw) as c:
                cut = await c.run_turn("[scenario:long_exec] build it", raise_on_error=False)
        async with running_sim(heartbeat_interval=0.1, long_exec_seconds=2, cert_dir=tmp_path / "cert2") as sim:
            async with AgentClient(sim.url, "t", verify=str(ca), heartbeat_interval=0.1, **kw) as c:
                done = await c.run_turn("[scenario:long_exec] build it")
    assert cut.error is not None and done.ended
    by_conv = findings_by_conversation(db)
    (cut_findings,) = by_conv[cut.conversation_id]
    root = [f for f in cut_findings if not f.is_note][0]
    assert root.code == "client_cancelled" and root.cause is None, cut_findings
    assert "shell_stream" in root.message
    assert ("cancel_action" in root.message) == (action == "cancel")
    if action == "reset":
        assert "RST_STREAM (CANCEL) from the client" in root.message
    if action == "disconnect":
        assert "the client's connection dropped" in root.message
    assert all(f.cause == "client_cancelled" for f in cut_findings if not f.is_note and f is not root), cut_findings
    (healthy,) = by_conv[done.conversation_id]
    assert problems(healthy) == [], healthy

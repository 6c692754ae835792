"""The failures bridge authors reported (issue 33), from imported flow files built frame by frame
(``flow_builders``, independent of the simulator): each imported with ``workbench import`` and
diagnosed with ``workbench diagnose --json``, beside its healthy twin with zero findings.

- a retried turn after a transport error after turn_ended (pi-cursor #3), and the harmless twin
  (a note), and a retry after a turn that really failed (no finding);
- the client's watchdog cancelling a long turn (oh-my-pi #6176): cancel_action, RST_STREAM,
  disconnect — the root cause the stall findings follow from;
- a wrong length prefix (pi-cursor 1.4.17): framing_lost, the turn_ended "unreadable";
- an unknown exec case never answered (pi-cursor #13); the stream held open after turn_ended
  (senpi #1062); arguments only in tool_call_started (oh-my-pi #9479); an empty get_blob_result
  (pi-cursor #25); a non-200 Run status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flow_builders import (
    cancel_action,
    checkpoint,
    client,
    client_disconnect,
    client_reset,
    end_stream,
    exec_shell_stream,
    heartbeat,
    misframed_text,
    run_flow,
    run_request,
    server,
    server_reset,
    shell_output,
    text,
    turn_ended,
    unknown_exec,
    update,
    write_flows,
)
from support import run_workbench

from workbench.schema import pb

pytestmark = pytest.mark.slow  # runs workbench subprocesses


def diagnose(tmp_path: Path, flows: list[Any], name: str = "s") -> list[dict[str, Any]]:
    """Import the flows into a fresh database and diagnose every session (in flow order)."""
    path = write_flows(tmp_path / f"{name}.flows", flows)
    db = tmp_path / f"{name}.duckdb"
    res = run_workbench("import", str(path), "--db", str(db), timeout=300)
    assert res.returncode == 0, res.stderr
    res = run_workbench("diagnose", "--all", "--json", "--db", str(db), timeout=300)
    assert res.returncode in (0, 1), res.stderr
    docs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    text_out = run_workbench("diagnose", "--all", "--db", str(db), timeout=300).stdout
    assert text_out  # the printed report is made from the same findings
    return sorted(docs, key=lambda d: min((f["first_seq"] or 0 for f in d["findings"] + d["notes"]), default=0))


def by_session(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["session_id"]: d for d in docs}


def codes(doc: dict[str, Any]) -> list[str]:
    return sorted(f["code"] for f in doc["findings"])


def note_codes(doc: dict[str, Any]) -> list[str]:
    return sorted(f["code"] for f in doc["notes"])


def one(doc: dict[str, Any], code: str) -> dict[str, Any]:
    found = [f for f in doc["findings"] + doc["notes"] if f["code"] == code]
    assert len(found) == 1, doc
    return found[0]


def completed_turn(prompt: str = "hello there") -> tuple[list[bytes], list[bytes]]:
    return [run_request(prompt)], [text("The answer."), checkpoint(), update(step_completed=pb.StepCompleted()),
                                   turn_ended()]


T0 = 1_700_000_000.0


# retried turn ------------------------------------------------------------------------------------

def test_a_reset_after_turn_ended_then_the_same_message_again_is_a_retried_turn(tmp_path: Path) -> None:
    req, resp = completed_turn()
    first = run_flow(req, resp, start=T0, reset=server_reset(2), error="stream reset by server (INTERNAL_ERROR)")
    again = run_flow(req, resp + [end_stream()], start=T0 + 5)
    docs = diagnose(tmp_path, [first, again])
    flagged = [d for d in docs if d["findings"]]
    assert len(flagged) == 1, docs
    f = one(flagged[0], "retried_turn")
    assert codes(flagged[0]) == ["retried_turn"] and f["severity"] == "warning"
    assert "RST_STREAM (INTERNAL_ERROR) from the server" in f["message"]
    assert "once" in f["message"] and "'hello there'" in f["message"]
    assert 4 in f["evidence"]  # the first run's turn_ended (run_request 0, text 1, checkpoint 2, step 3)
    clean = [d for d in docs if not d["findings"]]
    assert len(clean) == 1 and not clean[0]["notes"]  # the retry itself got a normal turn


def test_a_turn_retried_twice_after_a_dropped_connection_counts_both(tmp_path: Path) -> None:
    req, resp = completed_turn("summarise the repo")
    first = run_flow(req, resp, start=T0, reset=client_disconnect(), error="client disconnected")
    first.metadata["workbench_reset"]["after_response_end"] = True
    docs = diagnose(tmp_path, [first] + [run_flow(req, resp + [end_stream()], start=T0 + 5 * i) for i in (1, 2)])
    flagged = [d for d in docs if d["findings"]]
    assert len(flagged) == 1
    f = one(flagged[0], "retried_turn")
    assert "2 times" in f["message"] and "connection dropped" in f["message"]


def test_the_same_request_replayed_after_a_clean_end_is_a_retried_turn(tmp_path: Path) -> None:
    """A GOAWAY after the end-stream leaves nothing on the stream; the replayed request (the same
    bytes: the state not advanced to the turn's checkpoint) shows the retry. A follow-up with another
    message is no retry."""
    req, resp = completed_turn("deploy it")
    flows = [run_flow(req, resp + [end_stream()], start=T0), run_flow(req, resp + [end_stream()], start=T0 + 2),
             run_flow([run_request("and now the docs")], resp + [end_stream()], start=T0 + 9)]
    docs = diagnose(tmp_path, flows)
    retried = [f for d in docs for f in d["findings"] if f["code"] == "retried_turn"]
    assert len(retried) == 1, docs  # the first run only; neither the repeat nor the follow-up
    assert "nothing on it to show why" in retried[0]["message"] and "'deploy it'" in retried[0]["message"]


def test_a_reset_after_turn_ended_with_no_retry_is_only_a_note(tmp_path: Path) -> None:
    req, resp = completed_turn()
    docs = diagnose(tmp_path, [run_flow(req, resp, reset=server_reset(2), error="stream reset by server")])
    (doc,) = docs
    assert doc["findings"] == []
    assert note_codes(doc) == ["transport_error_after_turn"]
    assert "did no harm" in doc["notes"][0]["message"]


def test_a_retry_after_a_turn_that_really_failed_is_no_retried_turn(tmp_path: Path) -> None:
    req, resp = completed_turn()
    failed = run_flow(req, [text("The ans"), end_stream({"code": "unavailable", "message": "overloaded"})], start=T0)
    again = run_flow(req, resp + [end_stream()], start=T0 + 5)
    docs = diagnose(tmp_path, [failed, again])
    all_codes = [c for d in docs for c in codes(d) + note_codes(d)]
    assert all_codes == ["server_error"], docs  # the failure itself, nothing about the retry


# client cancelled --------------------------------------------------------------------------------

def _long_exec_cancelled(tail: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    req = [run_request("run the full test suite"), shell_output(1, "collected 4000 items\n"),
           shell_output(1, "....\n"), *tail]
    resp = [text("Running the tests."), exec_shell_stream(1, "pytest -x"), *[heartbeat() for _ in range(8)]]
    return req, resp


@pytest.mark.parametrize("how", ["cancel_action", "rst_stream", "disconnect"])
def test_a_watchdog_ending_a_long_exec_is_client_cancelled_not_a_missing_close(tmp_path: Path, how: str) -> None:
    tail = [cancel_action()] if how == "cancel_action" else []
    reset = {"cancel_action": client_reset(8), "rst_stream": client_reset(8), "disconnect": client_disconnect()}[how]
    req, resp = _long_exec_cancelled(tail)
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, duration=120, reset=reset, error="stream reset by client")])
    root = doc["findings"][0]
    assert root["code"] == "client_cancelled" and root["severity"] == "error" and root["cause"] is None, doc
    msg = root["message"]
    assert ("cancel_action" in msg) == (how == "cancel_action")
    assert ("RST_STREAM (CANCEL) from the client" in msg) == (how != "disconnect")
    assert ("client's connection dropped" in msg) == (how == "disconnect")
    assert "exec 1 (shell_stream_args, exec_id e1) streaming output" in msg
    assert 2 in root["evidence"]  # the exec
    followers = doc["findings"][1:]
    assert {f["code"] for f in followers} & {"missing_stream_close", "heartbeat_loop", "stream_ended_without_turn_end"}
    assert all(f["cause"] == "client_cancelled" for f in followers), followers


def test_a_reset_while_text_streams_names_the_text(tmp_path: Path) -> None:
    req = [run_request("write an essay")]
    resp = [text("Once upon"), text(" a time")]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, reset=client_reset(8), error="stream reset by client (CANCEL)")])
    f = one(doc, "client_cancelled")
    assert "the model's text streaming" in f["message"]
    assert all(x["cause"] == "client_cancelled" for x in doc["findings"] if x["code"] != "client_cancelled")


def test_a_long_exec_that_completes_is_healthy(tmp_path: Path) -> None:
    req = [run_request("run the full test suite"), shell_output(1, "collected 4000 items\n"),
           client(exec_client_message=pb.ExecClientMessage(id=1, exec_id="e1", shell_stream_result=pb.ShellStream(
               exit=pb.ShellStreamExit(code=0)))),
           client(exec_client_control_message=pb.ExecClientControlMessage(stream_close=pb.ExecClientStreamClose(id=1)))]
    resp = [text("Running the tests."), exec_shell_stream(1, "pytest -x"), *[heartbeat() for _ in range(8)],
            text("All passed."), checkpoint(), turn_ended(), end_stream()]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, duration=300, reset=client_reset(8, after_response_end=True))])
    assert doc["findings"] == [] and doc["notes"] == [], doc


# framing lost ------------------------------------------------------------------------------------

def test_a_wrong_length_prefix_is_framing_lost_and_the_turn_end_unreadable(tmp_path: Path) -> None:
    req, _ = completed_turn()
    resp = [text("Text before. "), checkpoint(), misframed_text("This frame's length prefix is wrong."),
            text("Text after it."), update(step_completed=pb.StepCompleted()), turn_ended(), end_stream()]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp)])
    f = one(doc, "framing_lost")
    assert f["severity"] == "error" and doc["findings"][0]["code"] == "framing_lost"
    assert "unreadable here, not missing" in f["message"]
    assert f"at byte {len(resp[0]) + len(resp[1])} of the response body" in f["message"]
    unreadable = sum(len(b) for b in resp[2:])
    assert f"{unreadable} bytes" in f["message"]
    assert "stream_ended_without_turn_end" not in codes(doc)


def test_lost_framing_with_no_turn_end_in_the_bytes_says_it_cannot_tell(tmp_path: Path) -> None:
    req, _ = completed_turn()
    resp = [text("Text before. "), misframed_text("broken", 7), text("more text"), text("and more")]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp)])
    f = one(doc, "framing_lost")
    assert "no turn_ended was found" in f["message"]


# kept handled ------------------------------------------------------------------------------------

def test_an_unknown_exec_case_left_unanswered_names_the_field_and_says_throw(tmp_path: Path) -> None:
    req, _ = completed_turn()
    resp = [unknown_exec(1, 56), *[heartbeat() for _ in range(6)], end_stream()]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, duration=60)])
    f = one(doc, "unanswered_exec")
    assert "field 56 of ExecServerMessage" in f["message"]
    assert "throw" in f["suggested_fix"] and "field 56" in f["suggested_fix"]


def test_an_unknown_exec_case_answered_with_throw_is_healthy(tmp_path: Path) -> None:
    req = [run_request("hi"), client(exec_client_control_message=pb.ExecClientControlMessage(
        throw=pb.ExecClientThrow(id=1, error="unknown exec case 56", error_code="UNIMPLEMENTED")))]
    resp = [unknown_exec(1, 56), text("Went on without it."), checkpoint(), turn_ended(), end_stream()]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp)])
    assert doc["findings"] == [], doc


def test_heartbeats_after_turn_ended_are_a_note_never_a_loop(tmp_path: Path) -> None:
    req, resp = completed_turn()
    (doc,) = diagnose(tmp_path, [run_flow(req, resp + [heartbeat() for _ in range(8)] + [end_stream()], duration=40)])
    assert doc["findings"] == [], doc
    f = one(doc, "stream_held_open")
    assert f["severity"] == "note" and "8 heartbeats" in f["message"] and "would hang" in f["message"]


def test_arguments_only_in_tool_call_started_are_healthy(tmp_path: Path) -> None:
    tc = pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command="ls -la")))
    req = [run_request("list"),
           client(exec_client_message=pb.ExecClientMessage(id=1, exec_id="e1", shell_stream_result=pb.ShellStream(
               exit=pb.ShellStreamExit(code=0)))),
           client(exec_client_control_message=pb.ExecClientControlMessage(stream_close=pb.ExecClientStreamClose(id=1)))]
    resp = [update(tool_call_started=pb.ToolCallStarted(call_id="c1", tool_call=tc)),
            server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", shell_stream_args=pb.ShellArgs(
                command="ls -la", tool_call_id="c1"))),
            update(tool_call_completed=pb.ToolCallCompleted(call_id="c1", tool_call=tc)),
            text("Listed."), checkpoint(), turn_ended(), end_stream()]
    path = write_flows(tmp_path / "args.flows", [run_flow(req, resp)])
    db = tmp_path / "args.duckdb"
    assert run_workbench("import", str(path), "--db", str(db)).returncode == 0
    res = run_workbench("diagnose", "--all", "--json", "--db", str(db))
    assert res.returncode == 0, res.stdout
    res = run_workbench("tools", "--json", "--db", str(db), json.loads(res.stdout.splitlines()[0])["session_id"])
    calls = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    (call,) = [c for c in calls if c["call_id"] == "c1"]
    merged = call["args_merged"] if isinstance(call["args_merged"], dict) else json.loads(call["args_merged"])
    assert merged.get("command") == "ls -la", call  # the started frame's args, merged without deltas


def test_an_empty_blob_answer_and_a_run_http_error_stay_handled(tmp_path: Path) -> None:
    blob = bytes(32)
    req = [run_request("hi"), client(kv_client_message=pb.KvClientMessage(id=1, get_blob_result=pb.GetBlobResult()))]
    resp = [server(kv_server_message=pb.KvServerMessage(id=1, get_blob_args=pb.GetBlobArgs(blob_id=blob))),
            text("I lost the context."), checkpoint(), turn_ended(), end_stream()]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp)], "blob")
    assert codes(doc) == ["blob_miss"]
    failed = run_flow([run_request("hi")], [], status=503)
    failed.response.raw_content = b"upstream unavailable"
    failed.response.headers = failed.response.headers.__class__([(b"content-type", b"text/plain")])
    (doc,) = diagnose(tmp_path, [failed], "http")
    assert codes(doc) == ["server_error"], doc


def test_a_client_giving_up_on_an_exec_it_never_answered_is_not_client_cancelled(tmp_path: Path) -> None:
    """The client reset after heartbeats it caused itself (an exec it ignored): the exec is the root
    cause, not the reset."""
    req = [run_request("hi")]
    resp = [text("Let me look."), exec_shell_stream(1, "ls"), *[heartbeat() for _ in range(6)]]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, reset=client_reset(8), error="stream reset by client (CANCEL)")])
    assert "client_cancelled" not in codes(doc)
    assert doc["findings"][0]["code"] == "unanswered_exec", doc


def test_a_client_giving_up_on_a_server_waiting_for_stream_close_is_not_client_cancelled(tmp_path: Path) -> None:
    """The December 2025 stall: a result alone, the server waits for stream_close, the client's
    heartbeat budget runs out and it resets. missing_stream_close is the root cause."""
    req = [run_request("list it"), client(exec_client_message=pb.ExecClientMessage(
        id=1, exec_id="e1", ls_result=pb.LsResult()))]
    resp = [server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", ls_args=pb.LsArgs(path="."))),
            *[heartbeat() for _ in range(8)]]
    (doc,) = diagnose(tmp_path, [run_flow(req, resp, reset=client_reset(8), error="stream reset by client (CANCEL)")])
    assert "client_cancelled" not in codes(doc)
    assert doc["findings"][0]["code"] == "missing_stream_close", doc

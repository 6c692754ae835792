"""The comparison itself on frames built in memory: ids and times ignored, fields the schema does
not name listed as unaligned (another build's schema), counts and timing past the threshold."""

from __future__ import annotations

import json
from typing import Any

from workbench.report.session import LoadedFrame, SessionView
from workbench.sessiondiff.compare import Options, diff_sessions


def _frame(seq: int, direction: str, kind: str, tree: Any, t: float, ref: int | None = None,
           meta: dict[str, Any] | None = None) -> LoadedFrame:
    return LoadedFrame(seq=seq, ts_us=int(t * 1e6), direction=direction, transport="run", kind=kind, summary=kind,
                       msg_type=None, flags=0, size=0, payload=b"", ref_id=ref, call_id=None, error=None, meta=meta,
                       _tree=tree)


def _view(frames: list[LoadedFrame], status: str = "complete") -> SessionView:
    return SessionView("s", "mem", {"status": status, "source": "test", "transport": "run"}, frames)


def _run(cmd: str, exec_id: str, extra: dict[str, Any] | None = None, t: float = 0.1) -> list[LoadedFrame]:
    args = {"command": cmd, "tool_call_id": exec_id, **(extra or {})}
    return [
        _frame(0, "client", "run_request", {"run_request": {"conversation_id": exec_id}}, 0.0),
        _frame(1, "server", "exec_server_message.shell_args",
               {"exec_server_message": {"id": 1, "exec_id": exec_id, "shell_args": args}}, t, ref=1),
        _frame(2, "client", "exec_client_message.shell_result", {"exec_client_message": {"id": 1}}, t + 0.01, ref=1),
        _frame(3, "client", "exec_client_control_message.stream_close", {}, t + 0.02, ref=1),
        _frame(4, "server", "interaction_update.turn_ended", {}, t + 0.03),
    ]


def test_ids_and_times_are_ignored() -> None:
    d = diff_sessions(_view(_run("ls", "aaa")), _view(_run("ls", "bbb", t=0.3)))
    assert d.same, d.differences


def test_changed_field_and_timing_past_threshold() -> None:
    d = diff_sessions(_view(_run("ls", "aaa")), _view(_run("rm -rf", "bbb", t=2.0)), Options(timing_threshold_s=0.5))
    changed = [x for x in d.differences if x["type"] == "changed_fields"]
    assert changed and changed[0]["fields"][0]["path"] == "exec_server_message.shell_args.command"
    assert changed[0]["fields"][0]["a"] == "ls" and changed[0]["fields"][0]["b"] == "rm -rf"
    assert d.first_divergence is changed[0] and d.first_sequence_divergence is None
    timing = [x for x in d.differences if x["type"] == "timing"]
    assert timing and timing[0]["kind"] == "exec_server_message.shell_args"
    assert not [x for x in diff_sessions(_view(_run("ls", "a")), _view(_run("ls", "b", t=0.4))).differences
                if x["type"] == "timing"]


def test_unnamed_fields_are_listed_not_dropped_nor_counted() -> None:
    # B was decoded with a schema that does not name field 9 of shell_args: listed as unaligned
    d = diff_sessions(_view(_run("ls", "a")), _view(_run("ls", "b", {"9": "new-field"})))
    assert d.same
    assert [(u["path"], u["a"], u["b"]) for u in d.unaligned] == [
        ("exec_server_message.shell_args.9", None, "new-field")]


def test_missing_stream_close_and_count() -> None:
    a = _run("ls", "a")
    b = [f for f in _run("ls", "b") if f.kind != "exec_client_control_message.stream_close"]
    b[-1:-1] = [_frame(10 + i, "server", "interaction_update.heartbeat", {}, 0.2 + i) for i in range(6)]
    d = diff_sessions(_view(a), _view(b, "aborted"))
    execs = [x for x in d.differences if x["type"] == "exec"]
    assert execs and "stream_close only in A" in execs[0]["text"]
    assert d.first_divergence is not None and d.first_divergence["type"] == "only_in_a"
    assert d.first_divergence["kind"] == "exec_client_control_message.stream_close"
    assert d.first_sequence_divergence is d.first_divergence
    assert d.stall["b"] is None  # the turn ended after them: slow, not stalled
    assert {x["type"] for x in d.differences} >= {"only_in_a", "only_in_b", "exec", "ending"}


def test_ids_inside_embedded_json_and_hash_values_are_ignored_values_kept_for_the_printer() -> None:
    def blob(call: str, turn_hash: str, text: str) -> list[LoadedFrame]:
        doc = json.dumps({"role": "tool", "id": call, "content": [{"toolCallId": call, "text": text}]})
        return [_frame(0, "server", "kv_server_message.set_blob_args", {"kv": {"blob_data": doc}}, 0.0),
                _frame(1, "server", "conversation_checkpoint_update", {"turns": [turn_hash]}, 0.01)]

    same = diff_sessions(_view(blob("toolu_a", "a" * 64, "ok")), _view(blob("toolu_b", "b" * 64, "ok")))
    assert same.same, same.differences
    d = diff_sessions(_view(blob("toolu_a", "a" * 64, "ok")), _view(blob("toolu_b", "b" * 64, "bad\u001b[2J")))
    changed = [x for x in d.differences if x["type"] == "changed_fields"]
    assert [c["path"] for c in changed[0]["fields"]] == ["kv.blob_data{json}.content[0].text"]
    # the value as it was (--json stays exact; workbench.textsafe escapes it at the terminal), line breaks
    # as the rest of the CLI writes them (issue 35: they were ``\x0a``)
    assert changed[0]["fields"][0]["b"] == "bad\u001b[2J"
    d = diff_sessions(_view(blob("a", "a" * 64, "one\ntwo")), _view(blob("b", "b" * 64, "one\nthree")))
    row = [x for x in d.differences if x["type"] == "changed_fields"][0]
    assert row["fields"][0]["b"] == "one\\nthree" and "\\x0a" not in row["text"] and "\n" not in row["text"]
    assert not diff_sessions(_view(blob("a", "a" * 64, "ok")), _view(blob("b", "b" * 64, "ok")),
                             Options(compare_ids=True)).same

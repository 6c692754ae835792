"""What a newcomer saw in `workbench diff` (issue 35): the first divergence is the first protocol
difference (not the prompt text), a step that only moved is one "moved" difference, an OpenAI
exchange ends in its own terms, streamed text is compared as text with a bounded window."""

from __future__ import annotations

from diff_rig import Session, chat_chunk, long_session, openai_session

from workbench.sessiondiff import streams
from workbench.sessiondiff.compare import diff_sessions
from workbench.sessiondiff.render import as_json, human


def test_first_divergence_after_a_differing_prompt_is_the_protocol_difference() -> None:
    a, b = Session("[scenario:tool_flow] List the files here."), Session("[scenario:stall] List the files here.")
    a.exec_step("ls")
    b.exec_step("ls", close=False)
    d = diff_sessions(a.end(), b.end())
    prompt = [x for x in d.differences if x["type"] == "changed_fields" and x["kind"] == "run_request"]
    assert prompt, "the prompt's change is still listed"
    fd = d.first_divergence
    assert fd is not None and fd is not prompt[0]
    assert fd["type"] == "only_in_a" and fd["kind"] == "exec_client_control_message.stream_close", fd
    assert "first divergence: only in A: → exec_client_control_message.stream_close" in human(d)


def test_the_same_prompt_changed_alone_is_still_the_first_divergence() -> None:
    a, b = Session("one"), Session("two")
    d = diff_sessions(a.end(), b.end())
    assert d.first_divergence is not None and d.first_divergence["kind"] == "run_request"


def test_a_step_that_only_moved_is_one_moved_difference() -> None:
    d = diff_sessions(long_session(6), long_session(6, moved=2))
    types = [x["type"] for x in d.differences]
    assert types.count("moved") == 1 and "only_in_a" not in types and "only_in_b" not in types, d.differences
    moved = next(x for x in d.differences if x["type"] == "moved")
    assert "exec_server_message.shell_args" in " ".join(moved["steps"])
    assert moved["a_seq"] < moved["b_seq"] and d.first_divergence is moved
    assert not [x for x in d.differences if x["type"] in ("exec", "tool_call", "tool_args")]
    assert sum(line.strip().startswith("moved:") for line in human(d).splitlines()) == 1


def test_an_inserted_exec_does_not_shift_the_ones_after_it() -> None:
    a = Session()
    b = Session()
    for cmd in ("ls", "cat a.py", "pytest"):
        a.exec_step(cmd)
    for cmd in ("ls", "git status", "cat a.py", "pytest"):
        b.exec_step(cmd)
    d = diff_sessions(a.end(), b.end())
    only_b = [x for x in d.differences if x["type"] == "only_in_b"]
    assert "exec_server_message.shell_args" in {x["kind"] for x in only_b}
    assert not [x for x in d.differences if x["type"] in ("only_in_a", "changed_fields")], d.differences


def test_openai_ending_in_its_own_terms() -> None:
    words = [chat_chunk({"role": "assistant"})] + [chat_chunk({"content": w}) for w in ("Hello", " there")]
    done = openai_session([*words, chat_chunk(finish="stop"), b"[DONE]"])
    cut = openai_session(words, status="aborted")
    d = diff_sessions(done, cut)
    ending = [x for x in d.differences if x["type"] == "ending" and isinstance(x.get("a"), dict)]
    assert ending, d.differences
    text = ending[0]["text"]
    assert "finish_reason stop, [DONE]" in text and "no finish_reason, no [DONE]" in text, text
    assert "turn_ended" not in text and "end_stream" not in text
    assert ending[0]["a"]["finish"] == "stop" and ending[0]["b"]["done"] is False
    assert diff_sessions(done, openai_session([*words, chat_chunk(finish="stop"), b"[DONE]"])).same


def test_streamed_text_cut_differently_is_the_same_text() -> None:
    a, b = Session(), Session()
    a.text(["Hel", "lo the", "re."])
    b.text(["Hello", " there."])
    d = diff_sessions(a.end(), b.end())
    assert [x["type"] for x in d.differences] == ["count"]   # the chunking differs, not the text
    assert d.first_divergence is d.differences[0]            # nothing of the protocol differs: the count is shown first


def test_streamed_text_that_differs_is_one_change_with_a_bounded_window() -> None:
    a, b = Session(), Session()
    body = [f"word{i} " for i in range(20_000)]
    a.text(body)
    b.text([*body[:15_000], "CHANGED ", *body[15_001:]])
    d = diff_sessions(a.end(), b.end())
    rows = [x for x in d.differences if x["type"] == "changed_fields"]
    assert len(rows) == 1, [x["text"][:80] for x in d.differences]
    row = rows[0]
    assert row["offset"] == len("".join(body[:15_000])) and row["a_chars"] == len("".join(body))
    for side in ("a", "b"):
        shown = row["fields"][0][side]
        assert shown is not None and len(shown) <= streams.CONTEXT + streams.SHOWN + 2
    assert "CHANGED" in str(row["fields"][0]["b"])
    assert as_json(d)["differences"][0]["type"] in ("changed_fields", "count")


def test_a_step_of_many_changed_frames_lists_a_bounded_number() -> None:
    from workbench.sessiondiff.compare import MAX_FRAME_ROWS

    a, b = Session(), Session()
    for i in range(200):
        a.add("server", "kv_server_message.set_blob_args", {"kv": {"blob_data": f"v{i}"}})
        b.add("server", "kv_server_message.set_blob_args", {"kv": {"blob_data": f"w{i}"}})
    d = diff_sessions(a.end(), b.end())
    rows = [x for x in d.differences if x["type"] == "changed_fields"]
    assert len(rows) == MAX_FRAME_ROWS and rows[-1]["more_frames"] == 200 - MAX_FRAME_ROWS
    assert "180 more frames of this step differ" in rows[-1]["text"]


def test_deeply_nested_json_inside_a_field_is_compared_as_text_without_a_traceback() -> None:
    a, b = Session(), Session()
    deep = "[" * 900 + "]" * 900
    a.add("server", "kv_server_message.set_blob_args", {"kv": {"blob_data": deep}})
    b.add("server", "kv_server_message.set_blob_args", {"kv": {"blob_data": deep[:-1] + " ]"}})
    d = diff_sessions(a.end(), b.end())
    rows = [x for x in d.differences if x["type"] == "changed_fields"]
    assert rows and rows[0]["fields"][0]["path"] == "kv.blob_data"

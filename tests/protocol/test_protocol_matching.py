"""Which client message answers which server message: pairing by ids, per turn."""

from __future__ import annotations

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Frame, default_decoder
from workbench.protocol.matching import (
    START,
    client_correlation,
    exec_string_id_of,
    pair_messages,
    server_correlation,
)
from workbench.schema import pb


def f(kind: str, ref: int | None = None) -> Frame:
    return Frame(kind, kind, b"", ref_id=ref)


RUN = f("run_request")
HB = f("client_heartbeat")
SHB = f("interaction_update.heartbeat")
TURN_END = f("interaction_update.turn_ended")


def test_answers_follow_what_they_answer_by_id() -> None:
    server = [f("kv_server_message.set_blob_args", 1), f("kv_server_message.get_blob_args", 2),
              f("exec_server_message.shell_args", 1), f("interaction_query.web_search_request_query", 1), TURN_END]
    client = [RUN, f("kv_client_message.get_blob_result", 2), f("kv_client_message.set_blob_result", 1), HB,
              f("exec_client_message.shell_result", 1), f("exec_client_control_message.stream_close", 1),
              f("interaction_response.web_search_request_response", 1)]
    p = pair_messages(server, client)
    assert p.problem is None
    # ids, not positions: kv 2 is answered first, yet pairs with the second request
    assert p.answers == [START, 1, 0, None, 2, 2, 3]
    assert p.answered_by == {1: [1], 0: [2], 2: [4, 5], 3: [6]}


def test_result_alone_and_streamed_shell_without_close() -> None:
    """The real-client style: a result alone (no stream_close), and a streamed shell whose final
    shell_result comes after its exit event."""
    server = [f("exec_server_message.read_args", 1), f("exec_server_message.shell_stream_args", 2),
              f("exec_server_message.ls_args", 3)]
    client = [RUN, f("exec_client_message.read_result", 1), f("exec_client_message.shell_stream_result", 2),
              f("exec_client_message.shell_stream_result", 2), f("exec_client_message.shell_result", 2),
              f("exec_client_message.ls_result", 3)]
    p = pair_messages(server, client)
    assert p.problem is None and p.answers == [START, 0, 1, 1, 1, 2]


def test_throw_then_close_and_exec_heartbeats() -> None:
    server = [f("exec_server_message.44", 5)]
    client = [RUN, f("exec_client_control_message.heartbeat", 5), f("exec_client_control_message.throw", 5),
              f("exec_client_control_message.stream_close", 5)]
    p = pair_messages(server, client)
    assert p.problem is None and p.answers == [START, 0, 0, 0]


def test_ids_restart_in_a_follow_up_turn() -> None:
    server = [f("exec_server_message.shell_args", 1), TURN_END, SHB, f("exec_server_message.shell_args", 1), TURN_END]
    client = [RUN, f("exec_client_message.shell_result", 1), f("exec_client_control_message.stream_close", 1),
              f("conversation_action.user_message_action"), f("exec_client_message.shell_result", 1)]
    p = pair_messages(server, client)
    assert p.problem is None
    assert p.answers == [START, 0, 0, 1, 3]  # the follow-up answers the first turn_ended


def test_result_alone_then_same_id_next_turn() -> None:
    """Without a close, the next turn's answer to exec 1 still pairs with the next turn's exec 1."""
    server = [f("exec_server_message.read_args", 1), TURN_END, f("exec_server_message.read_args", 1), TURN_END]
    client = [RUN, f("exec_client_message.read_result", 1), f("run_request"), f("exec_client_message.read_result", 1)]
    assert pair_messages(server, client).answers == [START, 0, 1, 2]


def test_unknown_or_repeated_ids_are_reported() -> None:
    server = [f("kv_server_message.set_blob_args", 1)]
    p = pair_messages(server, [RUN, f("kv_client_message.set_blob_result", 7)])
    assert p.problem is not None and "kv 7" in p.problem and "never asked" in p.problem
    p = pair_messages(server, [RUN, f("kv_client_message.set_blob_result", 1), f("kv_client_message.set_blob_result", 1)])
    assert p.problem is not None and "again" in p.problem
    p = pair_messages([f("exec_server_message.shell_args", 3), SHB, f("exec_server_message.read_args", 3)], [RUN])
    assert p.problem is not None and "exec 3 within one turn" in p.problem
    p = pair_messages([f("interaction_update.text_delta")], [RUN, f("run_request")])
    assert p.problem is not None and "turn 2" in p.problem


def test_real_messages_carry_ids_and_exec_id() -> None:
    dec = default_decoder()
    ask = pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=4, exec_id="ex-4", shell_args=pb.ShellArgs(command="ls"))).SerializeToString()
    answer = pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(
        id=4, exec_id="ex-4", shell_result=pb.ShellResult())).SerializeToString()
    close = pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=4))).SerializeToString()
    s = server_correlation(dec.classify_agent(ask, SERVER_MSG))
    a = client_correlation(dec.classify_agent(answer, CLIENT_MSG))
    c = client_correlation(dec.classify_agent(close, CLIENT_MSG))
    assert s is not None and (s.family, s.id, s.role, s.exec_id) == ("exec", 4, "request", "ex-4")
    assert a is not None and (a.family, a.id, a.role, a.exec_id) == ("exec", 4, "answer", "ex-4")
    assert c is not None and (c.family, c.id, c.role) == ("exec", 4, "close")
    assert exec_string_id_of("exec_client_message.shell_result", b"\xff\xff") is None  # undecodable: no id

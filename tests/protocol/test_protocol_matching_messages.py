"""Matching on parsed messages (the simulator's view) agrees with matching on decoded frames."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workbench.decode.classify import CLIENT_MSG, default_decoder
from workbench.protocol.matching import client_correlation, client_message_correlation, family_of
from workbench.schema import pb

ids = st.integers(0, 2**31)
exec_ids = st.text(alphabet="abcdef0123456789-", max_size=12)


def _messages() -> st.SearchStrategy[object]:
    control = st.one_of(
        st.builds(lambda i: pb.ExecClientControlMessage(stream_close=pb.ExecClientStreamClose(id=i)), ids),
        st.builds(lambda i: pb.ExecClientControlMessage(throw=pb.ExecClientThrow(id=i, error="no")), ids),
        st.builds(lambda i: pb.ExecClientControlMessage(heartbeat=pb.ExecClientHeartbeat(id=i)), ids))
    return st.one_of(
        st.builds(lambda i, e: pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(
            id=i, exec_id=e, shell_result=pb.ShellResult())), ids, exec_ids),
        st.builds(lambda i: pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
            id=i, get_blob_result=pb.GetBlobResult())), ids),
        st.builds(lambda i: pb.AgentClientMessage(interaction_response=pb.InteractionResponse(id=i)), ids),
        st.builds(lambda c: pb.AgentClientMessage(exec_client_control_message=c), control),
        st.just(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat())))


@given(_messages())
def test_the_parsed_message_and_its_frame_answer_the_same_request(msg: object) -> None:
    payload = msg.SerializeToString()  # type: ignore[attr-defined]
    frame = default_decoder().classify_agent(payload, CLIENT_MSG)
    assert client_message_correlation(msg) == client_correlation(frame)


def test_families_cover_requests_answers_and_control_messages() -> None:
    assert family_of("exec_server_message.shell_args") == "exec"
    assert family_of("exec_client_control_message.stream_close") == "exec"
    assert family_of("exec_server_control_message.abort") == "exec"
    assert family_of("kv_client_message.get_blob_result") == "kv"
    assert family_of("interaction_query.web_search_request_query") == "query"
    assert family_of("interaction_update.turn_ended") is None
    assert family_of("client_heartbeat") is None

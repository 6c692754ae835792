"""Run-request facts (``workbench.protocol.run_request``): model, conversation, state, action, prompt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workbench.decode.classify import CLIENT_MSG, default_decoder
from workbench.protocol.run_request import fill_session, run_request_facts
from workbench.schema import pb
from workbench.store.db import SessionInfo


def _run(**kw: object) -> bytes:
    return bytes(pb.AgentClientMessage(run_request=pb.AgentRunRequest(**kw)).SerializeToString())


def test_requested_model_wins_over_model_details() -> None:
    both = _run(requested_model=pb.RequestedModel(model_id="new"), model_details=pb.ModelDetails(model_id="old"))
    facts = run_request_facts("run_request", both)
    assert facts is not None
    assert facts.model == "new"
    only_details = run_request_facts("run_request", _run(model_details=pb.ModelDetails(model_id="old")))
    assert only_details is not None
    assert only_details.model == "old"
    neither = run_request_facts("run_request", _run(requested_model=pb.RequestedModel()))
    assert neither is not None
    assert neither.model is None


def test_state_action_and_prompt() -> None:
    payload = _run(conversation_state=pb.ConversationStateStructure(), conversation_id="c-1",
                   action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                       user_message=pb.UserMessage(text="hello"))))
    facts = run_request_facts("run_request", payload)
    assert facts is not None
    assert (facts.has_state, facts.state_empty) == (True, True)  # present, even empty (`0a 00`)
    assert (facts.conversation_id, facts.action, facts.prompt) == ("c-1", "user_message_action", "hello")
    bare = run_request_facts("run_request", _run())
    assert bare is not None
    assert (bare.has_state, bare.state_empty, bare.conversation_id, bare.action) == (False, True, None, None)


def test_prewarm_names_model_and_conversation() -> None:
    payload = bytes(pb.AgentClientMessage(prewarm_request=pb.PrewarmRequest(
        model_details=pb.ModelDetails(model_id="m"), conversation_id="c-2")).SerializeToString())
    facts = run_request_facts("prewarm_request", payload)
    assert facts is not None
    assert (facts.kind, facts.model, facts.conversation_id, facts.action) == ("prewarm_request", "m", "c-2", None)


def test_other_kinds_and_broken_bytes_have_no_facts() -> None:
    assert run_request_facts("client_heartbeat", _run()) is None
    assert run_request_facts("run_request", b"\xff\xff\xff") is None
    heartbeat = bytes(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
    assert run_request_facts("run_request", heartbeat) is None  # bytes of another message


@given(model=st.text(max_size=30), conversation=st.text(max_size=40), prompt=st.text(max_size=60))
def test_facts_agree_with_the_decoders_classification(model: str, conversation: str, prompt: str) -> None:
    payload = _run(requested_model=pb.RequestedModel(model_id=model), conversation_id=conversation,
                   action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                       user_message=pb.UserMessage(text=prompt))))
    dec = default_decoder()
    frame = dec.classify_agent(payload, CLIENT_MSG)
    facts = run_request_facts(frame.kind, frame.payload, dec.info(CLIENT_MSG).cls)
    assert frame.kind == "run_request"
    assert facts is not None
    assert (facts.model, facts.conversation_id, facts.prompt) == (model or None, conversation or None, prompt)


def test_fill_session_keeps_what_the_opening_message_does_not_name() -> None:
    info = SessionInfo(session_id="s", source="capture", model="earlier", conversation_id="c-0")
    named = run_request_facts("run_request", _run(requested_model=pb.RequestedModel(model_id="m"), conversation_id="c-1"))
    assert named is not None
    fill_session(info, named)
    assert info.model == "m"
    assert info.conversation_id == "c-1"
    silent = run_request_facts("run_request", _run())
    assert silent is not None
    fill_session(info, silent)
    assert info.model == "m"
    assert info.conversation_id == "c-1"

"""The byte-level fast paths stay on with the fuller overlay, and agree with the protobuf path on the
members the overlay added next to the layouts they hard-code."""

from __future__ import annotations

from workbench.decode.classify import SERVER_MSG, Decoder, default_decoder
from workbench.schema import pb


def test_every_fast_path_is_on_with_the_builtin_overlay() -> None:
    fp = default_decoder().fast_paths
    assert fp is not None
    assert fp.delta_ok
    assert fp.partial_ok
    assert set(fp.text_members) == {1, 4}  # text_delta, thinking_delta


def test_a_member_added_beside_a_fast_layout_takes_the_protobuf_path() -> None:
    fast, slow = default_decoder(), Decoder(fast=False)
    frames = [
        pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(tool_call_delta=pb.ToolCallDeltaUpdate(
            call_id="call_1", tool_call_delta=pb.ToolCallDelta(replace_env_tool_call_delta=pb.ReplaceEnvToolCallDelta(
                associated_pod_key="pod-7"))))),
        pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(tool_call_delta=pb.ToolCallDeltaUpdate(
            call_id="call_2", tool_call_delta=pb.ToolCallDelta(shell_tool_call_delta=pb.ShellToolCallDelta(
                stdout=pb.ShellToolCallStdoutDelta(content="ok\n")))))),
    ]
    for msg in frames:
        data = msg.SerializeToString()
        a, b = fast.classify_agent(data, SERVER_MSG), slow.classify_agent(data, SERVER_MSG)
        assert (a.kind, a.summary, a.call_id) == (b.kind, b.summary, b.call_id)
    last = fast.classify_agent(frames[0].SerializeToString(), SERVER_MSG)
    assert last.summary == 'tool_call_delta "call_1" replace_env_tool_call_delta'

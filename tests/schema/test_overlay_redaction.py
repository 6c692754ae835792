"""Redaction and fixture scrubbing on the messages the fuller overlay types.

Before, these fields were opaque ``bytes``: content redaction hid a whole field only when its name
was a content name, and the fixture scrubber walked the bytes schemalessly. Now they are messages
with field names nobody listed, so content is everything but the structure names, and credentials
are found in any ``credentials`` oneof (the server's ``subagent_args`` carries the user's own key).
"""

from __future__ import annotations

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG
from workbench.fixtures.format import FixtureFrame
from workbench.fixtures.scrub import Scrambler, scrub_frames
from workbench.redact import STRUCTURE_FIELDS, is_content_field, redact_payload
from workbench.schema import pb

KEY = b"k" * 32


def _pi_edit() -> bytes:
    return pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=3, exec_id="ex-3", pi_edit_args=pb.PiEditExecArgs(
            path="src/app.py", edits=[pb.PiEditReplacement(old_text="SECRET_OLD", new_text="SECRET_NEW")]),
    )).SerializeToString()


def _pi_bash_result() -> bytes:
    return pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(
        id=4, exec_id="ex-4", pi_bash_result=pb.PiBashExecResult(success=pb.PiBashExecSuccess(
            output="SECRET_OUTPUT", full_output_path="/tmp/out.txt")),
    )).SerializeToString()


def _rules() -> bytes:
    ctx = pb.RequestContext(rules=[pb.CursorRule(full_path=".cursor/rules/a.mdc", content="SECRET_RULE")])
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(conversation_id="conv-1", action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(request_context=ctx)))).SerializeToString()


def _question() -> bytes:
    return pb.AgentClientMessage(conversation_action=pb.ConversationAction(
        async_ask_question_completion_action=pb.AsyncAskQuestionCompletionAction(
            original_tool_call_id="call-1", original_args=pb.AskQuestionArgs(title="SECRET_TITLE")))
    ).SerializeToString()


def test_content_level_hides_text_of_newly_typed_messages_and_keeps_structure() -> None:
    for payload, msg_type in ((_pi_edit(), SERVER_MSG), (_pi_bash_result(), CLIENT_MSG), (_rules(), CLIENT_MSG),
                              (_question(), CLIENT_MSG)):
        assert b"SECRET_" in payload
        out = redact_payload(payload, msg_type, content=True)
        assert b"SECRET_" not in out, out
    edit = pb.AgentServerMessage.FromString(redact_payload(_pi_edit(), SERVER_MSG, content=True))
    assert edit.exec_server_message.exec_id == "ex-3"
    assert edit.exec_server_message.pi_edit_args.path == "src/app.py"
    req = pb.AgentClientMessage.FromString(redact_payload(_rules(), CLIENT_MSG, content=True))
    assert req.run_request.conversation_id == "conv-1"
    assert req.run_request.action.user_message_action.request_context.rules[0].full_path == ".cursor/rules/a.mdc"


def test_content_names_default_to_hidden() -> None:
    assert is_content_field("old_text")
    assert is_content_field("markdown")
    assert is_content_field("final_message")
    assert not is_content_field("path")
    assert not is_content_field("tool_call_id")
    assert not is_content_field("blob_id")
    assert is_content_field("text")
    assert "text" not in STRUCTURE_FIELDS


def test_subagent_credentials_from_the_server_are_hidden_at_the_secrets_level() -> None:
    msg = pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=9, exec_id="ex-9", subagent_args=pb.SubagentArgs(
            tool_call_id="call-9", prompt="explore the repo",
            api_key_credentials=pb.ApiKeyCredentials(api_key="sk-SECRETKEY", base_url="https://llm.example"))))
    data = msg.SerializeToString()
    out = redact_payload(data, SERVER_MSG)
    assert b"sk-SECRETKEY" not in out
    args = pb.AgentServerMessage.FromString(out).exec_server_message.subagent_args
    assert args.prompt == "explore the repo"
    assert args.api_key_credentials.base_url == "https://llm.example"
    # other exec messages stay byte-identical (and unparsed)
    shell = pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=1, shell_args=pb.ShellArgs(command="ls"))).SerializeToString()
    assert redact_payload(shell, SERVER_MSG) is shell


def test_subagent_model_lists_in_run_request_are_hidden() -> None:
    req = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        requested_model=pb.RequestedModel(model_id="m"),
        selected_subagent_models=[pb.RequestedModel(model_id="sub", bedrock_credentials=pb.BedrockCredentials(
            access_key="AKIASECRET", secret_key="SKSECRET", region="eu-west-1"))],
        subagent_model_overrides=[pb.SubagentModelOverride(subagent_type="explore", model=pb.RequestedModel(
            model_id="o", azure_credentials=pb.AzureCredentials(api_key="AZSECRET", deployment="dep")))],
    )).SerializeToString()
    out = redact_payload(req, CLIENT_MSG)
    for secret in (b"AKIASECRET", b"SKSECRET", b"AZSECRET"):
        assert secret not in out
    run = pb.AgentClientMessage.FromString(out).run_request
    assert run.selected_subagent_models[0].bedrock_credentials.region == "eu-west-1"
    assert run.subagent_model_overrides[0].model.azure_credentials.deployment == "dep"


def test_fixture_scrub_scrambles_newly_typed_text() -> None:
    frames = [
        FixtureFrame(0, 0.0, "server", "run", "exec_server_message.pi_edit_args", _pi_edit(),
                     msg_type=SERVER_MSG, ref_id=3),
        FixtureFrame(1, 0.1, "client", "run", "exec_client_message.pi_bash_result", _pi_bash_result(),
                     msg_type=CLIENT_MSG, ref_id=4),
    ]
    scrub_frames(frames, Scrambler(KEY))
    assert all(b"SECRET_" not in f.payload for f in frames)
    edit = pb.AgentServerMessage.FromString(frames[0].payload).exec_server_message
    assert edit.exec_id == "ex-3"
    assert len(edit.pi_edit_args.edits[0].old_text) == len("SECRET_OLD")

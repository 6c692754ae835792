"""The built-in overlay types every message-carrying field reachable from the agent envelopes.

``benchmarks/overlay_coverage.py`` counts from the compiled descriptors; these tests hold the
overlay to it: the reachable ``bytes`` fields are exactly an allow-list of fields that are bytes in
every public extraction too (blob ids, raw data) or that the decoder reads as
``google.protobuf.Value``; the comparison against another schema finds what it has and we lack;
and every frame kind the classifier could name before still exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import load_benchmark

from workbench.decode.tree import VALUE_BYTES

OC = load_benchmark("overlay_coverage")

# Reachable fields that stay ``bytes``: the public extractions type them ``bytes`` as well, except the
# three google.protobuf.Value ones, which the decoder turns into JSON (decode/tree.py VALUE_BYTES).
GENUINELY_BYTES = {
    # KV blob store: content-addressed ids and the blobs themselves
    "agent.v1.GetBlobArgs.blob_id", "agent.v1.GetBlobResult.blob_data",
    "agent.v1.SetBlobArgs.blob_id", "agent.v1.SetBlobArgs.blob_data",
    "agent.v1.PreFetchedBlob.id", "agent.v1.PreFetchedBlob.value",
    # the checkpoint holds blob ids, not messages (each id names a KV blob)
    "agent.v1.ConversationStateStructure.root_prompt_messages_json",
    "agent.v1.ConversationStateStructure.turns_old", "agent.v1.ConversationStateStructure.todos",
    "agent.v1.ConversationStateStructure.summary", "agent.v1.ConversationStateStructure.plan",
    "agent.v1.ConversationStateStructure.turns", "agent.v1.ConversationStateStructure.summary_archive",
    "agent.v1.ConversationStateStructure.summary_archives", "agent.v1.ConversationStateStructure.file_states[]",
    "agent.v1.FileStateStructure.content", "agent.v1.FileStateStructure.initial_content",
    # blob ids of messages stored out of line
    "agent.v1.UserMessage.conversation_state_blob_id", "agent.v1.UserMessage.text_blob_id",
    "agent.v1.UserMessage.rich_text_blob_id", "agent.v1.TruncatedToolCall.original_step_blob_id",
    "agent.v1.ReadSuccess.output_blob_id", "agent.v1.ReadToolSuccess.data_blob_id",
    "agent.v1.ReadToolSuccess.content_blob_id",
    # raw file / image / media bytes, or the blob id standing in for them
    "agent.v1.ReadSuccess.data", "agent.v1.ReadToolSuccess.data", "agent.v1.WriteArgs.file_bytes",
    "agent.v1.McpImageContent.data", "agent.v1.ReadMcpResourceSuccess.blob",
    "agent.v1.ExtraContextEntry.blob_id", "agent.v1.InvocationContext.blob_id",
    "agent.v1.SelectedDocument.blob_id", "agent.v1.SelectedDocument.data",
    "agent.v1.SelectedDocument.BlobIdWithData.blob_id", "agent.v1.SelectedDocument.BlobIdWithData.data",
    "agent.v1.SelectedExternalLink.blob_id", "agent.v1.SelectedGitPRDiffSelection.blob_id",
    "agent.v1.SelectedImage.blob_id", "agent.v1.SelectedImage.data",
    "agent.v1.SelectedImage.BlobIdWithData.blob_id", "agent.v1.SelectedImage.BlobIdWithData.data",
    "agent.v1.SelectedPullRequest.blob_id",
    "agent.v1.SelectedVideo.blob_id", "agent.v1.SelectedVideo.data",
    "agent.v1.SelectedVideo.BlobIdWithData.blob_id", "agent.v1.SelectedVideo.BlobIdWithData.data",
    # the BidiAppend wrapper's raw copy of the client message
    "aiserver.v1.BidiAppendRequest.data_bytes",
    # serialized google.protobuf.Value: MCP tool arguments and tool input schemas (JSON in the tree)
    "agent.v1.McpArgs.args[]", "agent.v1.McpToolDefinition.input_schema",
    "agent.v1.McpToolDescriptor.input_schema",
}

# Every kind the classifier named before the overlay grew (a public interface: users' SQL uses them).
KINDS_BEFORE = {
    "client_heartbeat": (),
    "conversation_action": (
        "async_ask_question_completion_action", "cancel_action", "cancel_subagent_action",
        "execute_plan_action", "resume_action", "shell_command_action", "start_plan_action",
        "summarize_action", "user_message_action",
    ),
    "conversation_checkpoint_update": (),
    "exec_client_control_message": (
        "heartbeat", "stream_close", "throw",
    ),
    "exec_client_message": (
        "agent_store_conflict_result", "background_shell_spawn_result", "canvas_diagnostics_result",
        "computer_use_result", "conversation_search_result", "delete_result", "diagnostics_result",
        "execute_hook_result", "fetch_result", "force_background_shell_result",
        "force_background_subagent_result", "git_diff_request_result", "grep_result",
        "list_mcp_resources_exec_result", "ls_result", "mcp_allowlist_precheck_result",
        "mcp_result", "mcp_state_exec_result", "mini_swe_agent_bash_result", "pi_bash_result",
        "pi_edit_result", "pi_find_result", "pi_grep_result", "pi_ls_result", "pi_read_result",
        "pi_write_result", "read_mcp_resource_exec_result", "read_result", "record_screen_result",
        "redacted_read_result", "request_context_result", "shell_allowlist_precheck_result",
        "shell_result", "shell_stream_result", "smart_mode_classifier_result",
        "subagent_await_result", "subagent_result", "web_fetch_allowlist_precheck_result",
        "write_result", "write_shell_stdin_result",
    ),
    "exec_server_control_message": (
        "abort",
    ),
    "exec_server_message": (
        "agent_store_conflict_args", "background_shell_spawn_args", "canvas_diagnostics_args",
        "computer_use_args", "conversation_search_args", "delete_args", "diagnostics_args",
        "execute_hook_args", "fetch_args", "force_background_shell_args",
        "force_background_subagent_args", "git_diff_request_args", "grep_args",
        "list_mcp_resources_exec_args", "ls_args", "mcp_allowlist_precheck_args", "mcp_args",
        "mcp_state_exec_args", "mini_swe_agent_bash_args", "pi_bash_args", "pi_edit_args",
        "pi_find_args", "pi_grep_args", "pi_ls_args", "pi_read_args", "pi_write_args", "read_args",
        "read_mcp_resource_exec_args", "record_screen_args", "redacted_read_args",
        "request_context_args", "shell_allowlist_precheck_args", "shell_args", "shell_stream_args",
        "smart_mode_classifier_args", "subagent_args", "subagent_await_args",
        "web_fetch_allowlist_precheck_args", "write_args", "write_shell_stdin_args",
    ),
    "interaction_query": (
        "ask_question_interaction_query", "create_plan_request_query", "exa_fetch_request_query",
        "exa_search_request_query", "setup_vm_environment_args", "switch_mode_request_query",
        "web_fetch_request_query", "web_search_request_query",
    ),
    "interaction_response": (
        "ask_question_interaction_response", "create_plan_request_response",
        "exa_fetch_request_response", "exa_search_request_response", "setup_vm_environment_result",
        "switch_mode_request_response", "web_fetch_request_response", "web_search_request_response",
    ),
    "interaction_update": (
        "heartbeat", "partial_tool_call", "shell_output_delta", "step_completed", "step_started",
        "summary", "summary_completed", "summary_started", "text_delta", "thinking_completed",
        "thinking_delta", "token_delta", "tool_call_completed", "tool_call_delta",
        "tool_call_started", "turn_ended", "user_message_appended",
    ),
    "kv_client_message": (
        "get_blob_result", "set_blob_result",
    ),
    "kv_server_message": (
        "get_blob_args", "set_blob_args",
    ),
    "prewarm_request": (),
    "run_request": (),
}


@pytest.fixture(scope="module")
def overlay() -> object:
    return OC.load()


def test_reachable_bytes_fields_are_exactly_the_genuine_ones(overlay: object) -> None:
    found = set(OC.bytes_fields(overlay))
    assert found - GENUINELY_BYTES == set(), "new bytes fields: type them, or add them here with a reason"
    assert GENUINELY_BYTES - found == set(), "allow-listed fields no longer bytes (or no longer reachable)"


def test_value_bytes_are_the_ones_the_decoder_reads_as_json() -> None:
    value_fields = {f"{m}.{f}" for m, f in VALUE_BYTES}
    listed = {b.removesuffix("[]") for b in GENUINELY_BYTES if b.endswith((".input_schema", "McpArgs.args[]"))}
    assert listed == value_fields


def test_counts_come_from_the_descriptors(overlay: object) -> None:
    c = OC.counts(overlay)
    assert c.reachable_bytes_fields == len(GENUINELY_BYTES)
    assert c.reachable_messages <= c.messages
    assert c.reachable_fields <= c.fields


def test_no_kind_was_renamed(overlay: object) -> None:
    before = {f"{top}.{m}" if m else top for top, members in KINDS_BEFORE.items() for m in (members or ("",))}
    now = set(OC.kinds(overlay))
    assert before <= now
    # oneof members that used to decode as bare numbers have names now
    assert {"interaction_update.prompt_suggestion", "interaction_query.mcp_auth_request_query",
            "conversation_action.background_shell_action"} <= now - before


OTHER = """
syntax = "proto3";
package agent.v1;

// A schema that types something we keep as bytes, has a field and messages we lack.
message AgentServerMessage {
  KvServerMessage kv_server_message = 4;
  Novel novel = 9;
}
message KvServerMessage {
  uint32 id = 1;
  SetBlobArgs set_blob_args = 3;
}
message SetBlobArgs {
  bytes blob_id = 1;
  BlobData blob_data = 2;
  string note = 7;
}
message BlobData { string text = 1; }
message Novel { string x = 1; }
"""


@pytest.mark.slow
def test_comparison_lists_what_another_schema_has_that_ours_lacks(overlay: object, tmp_path: Path) -> None:
    (tmp_path / "other.proto").write_text(OTHER)
    other = OC.load([tmp_path])
    cmp = OC.compare(overlay, other)
    assert cmp.bytes_vs_message == [("agent.v1.SetBlobArgs", "blob_data", "agent.v1.BlobData")]
    assert ("agent.v1.AgentServerMessage", 9, "novel", "agent.v1.Novel") in cmp.missing_fields
    assert ("agent.v1.SetBlobArgs", 7, "note", "string") in cmp.missing_fields
    assert cmp.missing_messages == ["agent.v1.BlobData", "agent.v1.Novel"]
    # and the overlay compared with itself lacks nothing
    same = OC.compare(overlay, overlay)
    assert same.bytes_vs_message == same.missing_fields == same.missing_messages == same.conflicts == []

"""Tool definitions sent in a run and tool calls read back from the stream (arguments rebuilt)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from workbench.client._pb import pb
from workbench.client.events import CallState
from workbench.protocol import args as tool_args

ToolDef = Any  # a McpToolDefinition dict (see tool_definition) or message


def tool_definition(tool: ToolDef) -> Any:
    """A McpToolDefinition from a dict (``input_schema`` as a JSON schema dict) or a message."""
    if isinstance(tool, Message):
        return tool
    name = str(tool["name"])
    schema = tool.get("input_schema") or tool.get("parameters") or {"type": "object", "properties": {}}
    return pb.McpToolDefinition(
        name=name, description=str(tool.get("description") or ""),
        input_schema=schema if isinstance(schema, bytes) else tool_args.encode_value(schema),
        provider_identifier=str(tool.get("provider_identifier") or ""),
        tool_name=str(tool.get("tool_name") or name))


def describe_tool_call(tc: Any) -> tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]:
    """(kind, name, typed args as JSON, McpArgs map as JSON) of a ToolCall message."""
    member = tc.WhichOneof("tool")
    if member is None:
        return "", "", None, None
    kind = member.removesuffix("_tool_call")
    wrapper = getattr(tc, member)
    if not wrapper.HasField("args"):
        return kind, kind, None, None
    targs = wrapper.args
    if kind == "mcp":
        return kind, targs.tool_name or targs.name, None, tool_args.mcp_args_to_json(targs.args)
    return kind, kind, json_format.MessageToDict(targs, preserving_proto_field_name=True), None


def final_args(st: CallState) -> dict[str, Any]:
    """The best reconstruction of a call's arguments (see ``args.merge_mcp_args``)."""
    streamed = tool_args.parse_args_text(st.args_text)
    other = st.completion_args if st.completion_args is not None else st.exec_args
    if st.kind == "mcp" or other is not None:
        return tool_args.merge_mcp_args(streamed, other)
    if streamed is not None:
        return streamed
    return dict(st.typed_args or {})



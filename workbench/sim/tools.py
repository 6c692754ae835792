"""Tool calls of the simulated model: the messages a ``tool`` step sends and how it reads answers.

- which client-offered tool a scenario's exec becomes (``pick_tool``, by name hints) and the
  arguments reshaped to that tool's JSON schema (``fit_args``);
- the ``ToolCall`` of partial/started/completed updates (``tool_call``) and the
  ``ExecServerMessage`` handed to the client (``exec_message``), per exec kind;
- the client's answer as a one-line summary (``result_summary``, for ``{tool_result}``) and as the
  result of the completed ``ToolCall`` (``attach_result``).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format, struct_pb2

from workbench.jsontypes import JsonObject
from workbench.schema import pb
from workbench.sim.schema_args import fill_args

_SHELL_HINTS = ("shell", "bash", "terminal", "exec", "command", "run")
_HINTS = {"shell": _SHELL_HINTS, "shell_stream": _SHELL_HINTS, "read": ("read", "cat", "view", "open"),
          "write": ("write", "edit", "create", "save"), "ls": ("ls", "list", "dir"),
          "grep": ("grep", "search", "find"), "delete": ("delete", "remove", "rm"), "mcp": ("task",)}
TOOL_NAMES = {"shell": "Shell", "shell_stream": "Shell", "read": "Read", "write": "Write", "ls": "LS",
              "grep": "Grep", "delete": "Delete"}


def value_bytes(v: Any) -> bytes:
    return bytes(json_format.ParseDict(v, struct_pb2.Value()).SerializeToString())


def pick_tool(tools: list[Any], kind: str, mcp_name: str) -> Any:
    hints = _HINTS.get(kind, ())
    if kind == "mcp":
        hints = (mcp_name.rpartition("___")[2].lower(), *hints)
    for hint in hints:
        for t in tools:
            if hint and hint in (t.tool_name or t.name).lower():
                return t
    return tools[0]


def tool_schema(tool: Any) -> JsonObject:
    try:
        if tool.input_schema_json:
            doc = json.loads(tool.input_schema_json)
        elif tool.input_schema:
            doc = json_format.MessageToDict(struct_pb2.Value.FromString(tool.input_schema))
        else:
            return {}
    except Exception:
        return {}
    return doc if isinstance(doc, dict) else {}


def fit_args(args: JsonObject, tool: Any) -> JsonObject:
    """The scenario's arguments reshaped to the client tool's JSON schema, as a model would fill
    them (``schema_args.fill_args``: kept where a property takes them, plausible values for the
    other required properties)."""
    return fill_args(tool_schema(tool), args)


def mcp_args(args: JsonObject, call_id: str, name: str, provider: str, tool_name: str) -> Any:
    return pb.McpArgs(name=name, args={k: value_bytes(v) for k, v in args.items()}, tool_call_id=call_id,
                      provider_identifier=provider, tool_name=tool_name)


def shell_args(args: JsonObject, call_id: str) -> Any:
    return pb.ShellArgs(command=str(args.get("command", "")), working_directory=str(args.get("working_directory", "")),
                        timeout=int(args.get("timeout", 30000)), tool_call_id=call_id)


def file_text(args: JsonObject) -> str:
    return str(args.get("file_text", args.get("contents", args.get("content", ""))))


def tool_call(kind: str, args: JsonObject, call_id: str, name: str, provider: str, tool_name: str,
               args_only_name: bool = False) -> Any:
    """The ToolCall of partial/started/completed updates (skeleton: the type, no arguments)."""
    tc = pb.ToolCall(tool_call_id=call_id)
    if kind in ("shell", "shell_stream"):
        tc.shell_tool_call.args.CopyFrom(shell_args(args, call_id) if args else pb.ShellArgs())
    elif kind == "read":
        tc.read_tool_call.args.CopyFrom(pb.ReadToolArgs(path=str(args.get("path", ""))))
    elif kind == "write":
        tc.edit_tool_call.args.CopyFrom(pb.EditArgs(path=str(args.get("path", "")), stream_content=file_text(args)))
    elif kind == "ls":
        tc.ls_tool_call.args.CopyFrom(pb.LsArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "grep":
        tc.grep_tool_call.args.CopyFrom(pb.GrepArgs(pattern=str(args.get("pattern", "")),
                                                    path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "delete":
        tc.delete_tool_call.args.CopyFrom(pb.DeleteArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    else:
        if args_only_name:
            tc.mcp_tool_call.args.CopyFrom(pb.McpArgs(name=name, tool_name=tool_name,
                                                      provider_identifier=provider, tool_call_id=call_id))
        else:
            tc.mcp_tool_call.args.CopyFrom(mcp_args(args, call_id, name, provider, tool_name))
    return tc


def exec_message(kind: str, args: JsonObject, call_id: str, name: str, provider: str, tool_name: str) -> Any:
    m = pb.ExecServerMessage()
    if kind == "shell":
        m.shell_args.CopyFrom(shell_args(args, call_id))
    elif kind == "shell_stream":
        m.shell_stream_args.CopyFrom(shell_args(args, call_id))
    elif kind == "read":
        m.read_args.CopyFrom(pb.ReadArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "write":
        m.write_args.CopyFrom(pb.WriteArgs(path=str(args.get("path", "")), file_text=file_text(args),
                                           tool_call_id=call_id))
    elif kind == "ls":
        m.ls_args.CopyFrom(pb.LsArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "grep":
        m.grep_args.CopyFrom(pb.GrepArgs(pattern=str(args.get("pattern", "")), path=str(args.get("path", "")),
                                         output_mode=str(args.get("output_mode", "content")), tool_call_id=call_id))
    elif kind == "delete":
        m.delete_args.CopyFrom(pb.DeleteArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    else:
        m.mcp_args.CopyFrom(mcp_args(args, call_id, name, provider, tool_name))
    return m


def result_summary(kind: str, results: list[Any], thrown: str | None) -> tuple[str, str]:
    """A one-line description of the client's answer, and shell output for tool_call_delta."""
    if thrown is not None:
        return f"error: {thrown}", ""
    if not results:
        return "(no result)", ""
    r = results[-1]
    member = r.WhichOneof("result")
    if kind == "shell_stream":
        out = "".join(x.shell_stream_result.stdout.data for x in results
                      if x.WhichOneof("result") == "shell_stream_result"
                      and x.shell_stream_result.WhichOneof("event") == "stdout")
        return out.strip() or "(no output)", out
    if member == "shell_result":
        case = r.shell_result.WhichOneof("result")
        if case in ("success", "failure"):
            s = getattr(r.shell_result, case)
            out = s.stdout or s.interleaved_output
            return (out.strip() or f"exit {s.exit_code}"), out
        return f"shell {case}", ""
    if member == "read_result":
        case = r.read_result.WhichOneof("result")
        if case == "success":
            s = r.read_result.success
            content = s.content or s.data.decode("utf-8", "replace")
            return f"{len(content.splitlines())} lines of {s.path or 'the file'}", ""
        return f"read {case}", ""
    if member == "mcp_result":
        case = r.mcp_result.WhichOneof("result")
        if case == "success":
            texts = [c.text.text for c in r.mcp_result.success.content if c.WhichOneof("content") == "text"]
            return " ".join(texts).strip() or "(empty MCP result)", ""
        return f"mcp {case}", ""
    if member is None:
        return "(empty result)", ""
    case = getattr(r, member).WhichOneof("result")
    return f"{member.removesuffix('_result')} {case}", ""


def attach_result(tc: Any, kind: str, results: list[Any], thrown: str | None) -> None:
    r: Any = results[-1] if results else None
    member = r.WhichOneof("result") if r is not None else None
    if kind == "shell_stream":
        exit_code = 0
        out = err = ""
        for x in results:
            if x.WhichOneof("result") != "shell_stream_result":
                continue
            ev = x.shell_stream_result
            case = ev.WhichOneof("event")
            if case == "stdout":
                out += ev.stdout.data
            elif case == "stderr":
                err += ev.stderr.data
            elif case == "exit":
                exit_code = ev.exit.code
        if thrown is None:
            tc.shell_tool_call.result.success.CopyFrom(pb.ShellSuccess(
                command=tc.shell_tool_call.args.command, exit_code=exit_code, stdout=out, stderr=err))
        return
    if kind == "shell" and member == "shell_result":
        tc.shell_tool_call.result.CopyFrom(r.shell_result)
    elif kind == "read" and member == "read_result":
        if r.read_result.WhichOneof("result") == "success":
            s = r.read_result.success
            tc.read_tool_call.result.success.CopyFrom(pb.ReadToolSuccess(
                content=s.content, path=s.path, total_lines=max(0, s.total_lines), file_size=s.file_size))
        else:
            tc.read_tool_call.result.error.error_message = f"read {r.read_result.WhichOneof('result')}"
    elif kind == "read" and thrown is not None:
        tc.read_tool_call.result.error.error_message = thrown
    elif kind == "write" and member == "write_result":
        if r.write_result.WhichOneof("result") == "success":
            s = r.write_result.success
            tc.edit_tool_call.result.success.CopyFrom(pb.EditSuccess(
                path=s.path, lines_added=s.lines_created, message="file written"))
        else:
            tc.edit_tool_call.result.error.error = f"write {r.write_result.WhichOneof('result')}"
    elif kind == "ls" and member == "ls_result":
        tc.ls_tool_call.result.CopyFrom(r.ls_result)
    elif kind == "grep" and member == "grep_result":
        tc.grep_tool_call.result.CopyFrom(r.grep_result)
    elif kind == "delete" and member == "delete_result":
        tc.delete_tool_call.result.CopyFrom(r.delete_result)
    elif kind == "mcp":
        if member == "mcp_result" and r.mcp_result.WhichOneof("result") == "success":
            tc.mcp_tool_call.result.success.CopyFrom(r.mcp_result.success)
        elif thrown is not None:
            tc.mcp_tool_call.result.error.error = thrown
        elif member == "mcp_result":
            tc.mcp_tool_call.result.error.error = f"mcp {r.mcp_result.WhichOneof('result')}"


"""What the decoder reads by name, checked against a user schema before it is used.

The classifier and the one-line summaries read fields by attribute name (``msg.id``,
``set_blob_args.blob_data``, ``HasField("blob_data")`` …). A user schema that lacks one of them,
or types it so the attribute read would fail (bytes where a message is read, a string where a
number is stored, no presence where ``HasField`` is called), would crash the decoder on the first
such frame. So the loader checks every entry here and refuses the schema with the message and
field named (exit 2) instead. Paths that do not exist in the schema are not checked: the decoder
never reaches them (a oneof member the schema does not have never becomes a frame kind).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

SERVER = "agent.v1.AgentServerMessage"
CLIENT = "agent.v1.AgentClientMessage"

INT = "integer"
TEXT = "string"
BYTES = "bytes"
MESSAGE = "message"
REPEATED = "repeated"
PRESENCE = "bytes with presence"

_INT_TYPES = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
              FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
              FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
              FieldDescriptor.TYPE_SFIXED64}


@dataclass(frozen=True)
class Need:
    """``root`` → fields along ``path`` (each a message) → field ``name`` of ``kind``."""

    root: str
    path: tuple[str, ...]
    name: str
    kind: str


def _needs() -> list[Need]:
    out: list[Need] = []
    for root, top in ((SERVER, "exec_server_message"), (CLIENT, "exec_client_message"),
                      (SERVER, "kv_server_message"), (CLIENT, "kv_client_message"),
                      (SERVER, "interaction_query"), (CLIENT, "interaction_response")):
        out.append(Need(root, (top,), "id", INT))
    upd = (SERVER, ("interaction_update",))
    for member, fields in {
        "text_delta": (("text", TEXT),), "thinking_delta": (("text", TEXT),),
        "token_delta": (("tokens", INT),), "thinking_completed": (("thinking_duration_ms", INT),),
        "partial_tool_call": (("call_id", TEXT), ("args_text_delta", TEXT)),
        "tool_call_started": (("call_id", TEXT), ("tool_call", MESSAGE)),
        "tool_call_completed": (("call_id", TEXT), ("tool_call", MESSAGE)),
        "tool_call_delta": (("call_id", TEXT), ("tool_call_delta", MESSAGE)),
        "step_started": (("step_id", INT),), "step_completed": (("step_id", INT), ("step_duration_ms", INT)),
        "summary": (("summary", TEXT),),
    }.items():
        for name, kind in fields:
            out.append(Need(upd[0], (*upd[1], member), name, kind))
    esm = (SERVER, "exec_server_message")
    for member, fields in {
        "shell_args": (("command", TEXT),), "shell_stream_args": (("command", TEXT),),
        "read_args": (("path", TEXT),), "ls_args": (("path", TEXT),), "delete_args": (("path", TEXT),),
        "write_args": (("path", TEXT),), "grep_args": (("pattern", TEXT), ("glob", TEXT)),
        "mcp_args": (("name", TEXT), ("tool_name", TEXT), ("args", REPEATED)), "fetch_args": (("url", TEXT),),
    }.items():
        for name, kind in fields:
            out.append(Need(esm[0], (esm[1], member), name, kind))
    for member in ("success", "failure"):
        out.append(Need(CLIENT, ("exec_client_message", "shell_result", member), "exit_code", INT))
    out += [
        Need(SERVER, ("kv_server_message", "set_blob_args"), "blob_data", BYTES),
        Need(SERVER, ("kv_server_message", "set_blob_args"), "blob_id", BYTES),
        Need(SERVER, ("kv_server_message", "get_blob_args"), "blob_id", BYTES),
        Need(CLIENT, ("kv_client_message", "get_blob_result"), "blob_data", PRESENCE),
        Need(CLIENT, ("kv_client_message", "set_blob_result"), "error", MESSAGE),
        Need(CLIENT, ("kv_client_message", "set_blob_result", "error"), "message", TEXT),
        Need(SERVER, ("conversation_checkpoint_update",), "turns", REPEATED),
        Need(SERVER, ("conversation_checkpoint_update",), "token_details", MESSAGE),
        Need(SERVER, ("conversation_checkpoint_update", "token_details"), "used_tokens", INT),
        Need(CLIENT, ("run_request",), "requested_model", MESSAGE),
        Need(CLIENT, ("run_request",), "model_details", MESSAGE),
        Need(CLIENT, ("run_request",), "action", MESSAGE),
        Need(CLIENT, ("run_request",), "conversation_state", MESSAGE),
        Need(CLIENT, ("run_request", "requested_model"), "model_id", TEXT),
        Need(CLIENT, ("run_request", "model_details"), "model_id", TEXT),
        Need(CLIENT, ("run_request", "action"), "user_message_action", MESSAGE),
        Need(CLIENT, ("run_request", "action", "user_message_action"), "user_message", MESSAGE),
        Need(CLIENT, ("run_request", "action", "user_message_action", "user_message"), "text", TEXT),
    ]
    for top in ("exec_client_control_message", "exec_server_control_message"):
        root = CLIENT if top.startswith("exec_client") else SERVER
        out.append(Need(root, (top, "*"), "id", INT))
    out.append(Need(CLIENT, ("exec_client_control_message", "throw"), "error", TEXT))
    return out


NEEDS = _needs()


def _kind_ok(fd: FieldDescriptor, kind: str) -> bool:
    repeated = fd.is_repeated
    if kind == REPEATED:
        return repeated
    if repeated:
        return False
    if kind == INT:
        return fd.type in _INT_TYPES or fd.type == FieldDescriptor.TYPE_ENUM
    if kind == TEXT:
        return fd.type == FieldDescriptor.TYPE_STRING
    if kind == BYTES:
        return fd.type == FieldDescriptor.TYPE_BYTES
    if kind == PRESENCE:
        return fd.type == FieldDescriptor.TYPE_BYTES and fd.has_presence
    if kind == MESSAGE:
        return fd.type == FieldDescriptor.TYPE_MESSAGE
    return False


def _real_oneof_members(desc: Descriptor) -> list[FieldDescriptor]:
    for oneof in desc.oneofs:
        if len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name:
            continue
        return list(oneof.fields)
    return []


def _containers(desc: Descriptor, path: tuple[str, ...], trail: str) -> list[tuple[Descriptor, str]] | str:
    """The message types reached along ``path``, or a problem text when a step is not a message."""
    if not path:
        return [(desc, trail)]
    step, rest = path[0], path[1:]
    if step == "*":
        fields = _real_oneof_members(desc)
    else:
        fd = desc.fields_by_name.get(step)
        fields = [fd] if fd is not None else []
    out: list[tuple[Descriptor, str]] = []
    for fd in fields:
        where = f"{trail}.{fd.name}"
        if fd.message_type is None or fd.is_repeated:
            return f"{where} is {_type_text(fd)}, but the decoder reads fields of it as a message"
        found = _containers(fd.message_type, rest, where)
        if isinstance(found, str):
            return found
        out += found
    return out


def _type_text(fd: FieldDescriptor) -> str:
    label = "repeated " if fd.is_repeated else ""
    if fd.message_type is not None:
        return label + fd.message_type.full_name
    if fd.enum_type is not None:
        return label + fd.enum_type.full_name
    names = {v: k[5:].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return label + names.get(fd.type, str(fd.type))


def check(lookup: Callable[[str], Descriptor]) -> list[str]:
    """Problems that make a schema unusable for the decoder (empty when usable).

    ``lookup(full_name)`` returns the message Descriptor or raises KeyError.
    """
    problems: list[str] = []
    for root in (SERVER, CLIENT):
        try:
            lookup(root)
        except KeyError:
            problems.append(f"{root} is missing")
    seen: set[str] = set()
    for need in NEEDS:
        try:
            root_desc = lookup(need.root)
        except KeyError:
            continue
        found = _containers(root_desc, need.path, root_desc.full_name)
        if isinstance(found, str):
            problem = found
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
            continue
        for desc, where in found:
            fd = desc.fields_by_name.get(need.name)
            if fd is None:
                problem = f"{desc.full_name} (at {where}) has no field `{need.name}` ({need.kind})"
            elif not _kind_ok(fd, need.kind):
                problem = (f"{desc.full_name}.{need.name} (at {where}) is {_type_text(fd)}"
                           f"{' without presence' if need.kind == PRESENCE else ''}; the decoder needs {need.kind}")
            else:
                continue
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
    return problems

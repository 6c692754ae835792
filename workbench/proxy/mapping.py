"""OpenAI ⇄ Cursor agent mapping for the proxy (the policy the seeds settled on).

- request ``tools`` (OpenAI functions) become McpToolDefinitions, on every request;
- an exec request becomes one OpenAI tool call: shell→``bash``, read→``read``, write→``write``,
  delete→``delete``, ls→``list``, grep with a pattern→``grep``, grep with only a glob→``glob``,
  mcp→its own name; argument names follow the offered tool's schema when it names them;
- a follow-up carrying ``role: "tool"`` messages is flattened, whole history included, into the
  user text of a fresh run (same-session continuation streams nothing, docs/protocol.md §7 kv_only_response).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.client.events import ExecRequest
from workbench.jsontypes import JsonObject
from workbench.protocol import args as tool_args
from workbench.protocol.status import error_facts

PROVIDER = "openai-proxy"

# exec kind → OpenAI tool name (grep is split on whether it carries a pattern)
TOOL_NAMES = {"shell": "bash", "shell_stream": "bash", "read": "read", "write": "write", "delete": "delete",
              "ls": "list", "grep": "grep", "mcp": "mcp"}

# argument name candidates, first = default when the offered schema names none of them
_PATH = ("filePath", "path", "file_path", "file")
_CANDIDATES: dict[str, dict[str, tuple[str, ...]]] = {
    "bash": {"command": ("command", "cmd"), "workdir": ("workdir", "cwd", "working_directory"),
             "timeout": ("timeout",)},
    "read": {"path": _PATH, "offset": ("offset",), "limit": ("limit",)},
    "write": {"path": _PATH, "content": ("content", "contents", "file_text", "text")},
    "delete": {"path": _PATH},
    "list": {"path": ("path", "dir", "directory", "filePath"), "ignore": ("ignore",)},
    "grep": {"pattern": ("pattern", "regex", "query"), "path": ("path", "dir", "directory"),
             "include": ("include", "glob", "filePattern")},
    "glob": {"pattern": ("pattern", "glob"), "path": ("path", "dir", "directory")},
}


class MappingError(ValueError):
    """The OpenAI request cannot be mapped (the message names the offending field)."""


def tools_to_mcp(tools: Sequence[Mapping[str, Any]] | None) -> list[JsonObject]:
    """OpenAI ``tools`` → McpToolDefinition dicts (``AgentClient`` accepts these)."""
    out: list[JsonObject] = []
    for i, tool in enumerate(tools or ()):
        if not isinstance(tool, Mapping):
            raise MappingError(f"tools[{i}] must be an object")
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(fn, Mapping) or not fn.get("name"):
            raise MappingError(f"tools[{i}]: only {{\"type\": \"function\", \"function\": {{\"name\": …}}}} is supported")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        out.append({"name": str(fn["name"]), "description": str(fn.get("description") or ""),
                    "input_schema": params, "provider_identifier": PROVIDER, "tool_name": str(fn["name"])})
    return out


def offered_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, JsonObject]:
    """Tool name → its JSON-schema ``properties``."""
    out: dict[str, JsonObject] = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name"):
            params = fn.get("parameters") or {}
            props = params.get("properties") if isinstance(params, Mapping) else None
            out[str(fn["name"])] = dict(props) if isinstance(props, Mapping) else {}
    return out


def _pick(props: Mapping[str, Any], candidates: tuple[str, ...]) -> str:
    for c in candidates:
        if c in props:
            return c
    return candidates[0]


def _named(tool: str, values: Mapping[str, Any], props: Mapping[str, Any]) -> JsonObject:
    cands = _CANDIDATES[tool]
    return {_pick(props, cands[k]): v for k, v in values.items() if k in cands}


def openai_tool_name(req: ExecRequest, offered: Mapping[str, Any] | None = None) -> str:
    offered = offered or {}
    if req.kind == "grep":
        return "grep" if req.args.get("pattern") else "glob"
    if req.kind == "mcp":
        names = [req.args.get("tool_name") or "", req.args.get("name") or ""]
        for n in names:
            if n and n in offered:
                return str(n)
        for n in names:
            if "___" in n and n.split("___", 1)[1] in offered:
                return n.split("___", 1)[1]
        return str(names[0] or names[1] or "mcp")
    return TOOL_NAMES.get(req.kind, req.kind)


def exec_to_tool_call(req: ExecRequest, offered: Mapping[str, Mapping[str, Any]] | None = None
                      ) -> tuple[str, str]:
    """(OpenAI function name, arguments JSON text) for an exec request.

    MCP arguments come from the streamed tool call when there is one (snapshot-aware text merged
    with the exec's McpArgs); streamed text that does not parse is passed on verbatim — which is
    exactly what a client with the ``naive_args_concat`` bug forwards.
    """
    offered = offered or {}
    name = openai_tool_name(req, offered)
    props = offered.get(name) or {}
    a = req.args
    if req.kind == "mcp":
        exec_args = a.get("args") if isinstance(a.get("args"), dict) else {}
        call = req.call
        if call is not None and call.args_text:
            streamed = tool_args.parse_args_text(call.args_text)
            if streamed is None:
                return name, call.args_text
            return name, json.dumps(tool_args.merge_mcp_args(streamed, exec_args), ensure_ascii=False)
        return name, json.dumps(exec_args, ensure_ascii=False)
    values: JsonObject
    if req.kind in ("shell", "shell_stream"):
        values = {"command": a.get("command", "")}
        if a.get("working_directory"):
            values["workdir"] = a["working_directory"]
        if a.get("timeout"):
            values["timeout"] = a["timeout"]
    elif req.kind == "read":
        values = {"path": a.get("path", "")}
        for k in ("offset", "limit"):
            if a.get(k):
                values[k] = a[k]
    elif req.kind == "write":
        values = {"path": a.get("path", ""), "content": a.get("file_text", "")}
    elif req.kind == "delete":
        values = {"path": a.get("path", "")}
    elif req.kind == "ls":
        values = {"path": a.get("path", "")}
        if a.get("ignore"):
            values["ignore"] = a["ignore"]
    elif req.kind == "grep" and name == "grep":
        values = {"pattern": a.get("pattern", ""), "path": a.get("path", "")}
        if a.get("glob"):
            values["include"] = a["glob"]
    elif req.kind == "grep":
        values = {"pattern": a.get("glob", ""), "path": a.get("path", "")}
    else:
        return name, json.dumps(a, ensure_ascii=False)
    return name, json.dumps(_named(name, values, props), ensure_ascii=False)


_SAFE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


def openai_call_id(req: ExecRequest) -> str:
    """A tool_call id OpenAI clients accept (Cursor call ids may contain newlines, docs/protocol.md §4)."""
    cid = req.call.call_id if req.call is not None and req.call.call_id else ""
    if cid and _SAFE_ID.match(cid):
        return cid
    seed = cid or f"{req.exec_id}:{req.id}"
    return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def content_text(content: Any) -> str:
    """OpenAI message content (string or list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") in ("text", "input_text", "output_text"):
                    parts.append(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    parts.append("[image omitted]")
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def flatten_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """The whole OpenAI history as the user text of one fresh run.

    System/developer messages go first inside ``<rules>`` (root system prompts are ignored by the
    backend, docs/protocol.md §6). A lone user message is sent as is; otherwise the history is written
    out turn by turn, tool calls with their ids and results as ``TOOL_RESULT (call_id: …)`` blocks.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise MappingError("messages must be a non-empty list")
    rules: list[str] = []
    convo: list[Mapping[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise MappingError(f"messages[{i}] must be an object with a role")
        if m["role"] in ("system", "developer"):
            rules.append(content_text(m.get("content")))
        else:
            convo.append(m)
    out: list[str] = []
    if rules:
        out.append("<rules>\n" + "\n\n".join(r for r in rules if r) + "\n</rules>")
    if len(convo) == 1 and convo[0]["role"] == "user":
        out.append(content_text(convo[0].get("content")))
        return "\n\n".join(out)
    names: dict[str, str] = {}
    lines: list[str] = []
    for m in convo:
        role = m["role"]
        text = content_text(m.get("content"))
        if role == "user":
            lines.append(f"USER:\n{text}")
        elif role == "assistant":
            if text:
                lines.append(f"ASSISTANT:\n{text}")
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                names[str(tc.get("id"))] = str(fn.get("name", ""))
                lines.append(f"ASSISTANT TOOL_CALL (call_id: {tc.get('id')}): {fn.get('name')} "
                             f"{fn.get('arguments', '')}")
        elif role == "tool":
            cid = str(m.get("tool_call_id", ""))
            name = m.get("name") or names.get(cid, "")
            lines.append(f"TOOL_RESULT (call_id: {cid}{', name: ' + name if name else ''}):\n{text}")
        else:
            lines.append(f"{str(role).upper()}:\n{text}")
    last = convo[-1]["role"] if convo else "user"
    tail = ("Continue: use the tool results above to answer the user's request (call further tools "
            "if the task needs them)." if last == "tool" else "Respond to the last USER message.")
    out.append("<conversation_history>\n" + "\n\n".join(lines) + "\n</conversation_history>\n\n" + tail)
    return "\n\n".join(out)


def has_tool_results(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(isinstance(m, Mapping) and m.get("role") == "tool" for m in messages)


# Connect error code → HTTP status of the OpenAI-style error
HTTP_STATUS = {"resource_exhausted": 429, "unauthenticated": 401, "permission_denied": 403, "not_found": 404,
               "invalid_argument": 400, "heartbeat_budget": 504, "deadline_exceeded": 504}

# Connect code → OpenAI error type
ERROR_TYPES = {"resource_exhausted": "rate_limit_error", "unauthenticated": "authentication_error",
               "permission_denied": "permission_error", "not_found": "not_found_error",
               "invalid_argument": "invalid_request_error"}

# aiserver.v1.ErrorDetails.error → (OpenAI error code, OpenAI error type), where OpenAI has a word for
# the same situation (its SDK users match on these); other errors keep the Connect code.
CURSOR_ERRORS = {"ERROR_BAD_MODEL_NAME": ("model_not_found", "invalid_request_error"),
                 "ERROR_RATE_LIMITED_CHANGEABLE": ("rate_limit_exceeded", "rate_limit_error")}


def error_status(code: str) -> int:
    return HTTP_STATUS.get(code, 502)


def error_body(code: str, message: str, details: Sequence[Mapping[str, Any]] = ()) -> JsonObject:
    """An OpenAI error object in Cursor's words.

    The Connect message is often just "Error"; the words are in ``details[]`` (an
    ``aiserver.v1.ErrorDetails``: docs/protocol.md §2, Errors). The OpenAI ``message`` is the detail
    (else the title, else the Connect message); ``code`` is OpenAI's own code where there is one
    (``model_not_found``), else the Connect code. Cursor's title, ``ERROR_…`` label and
    retryability, the Connect code and the raw details ride along as extra fields.
    """
    facts = error_facts(code, message, details)
    oa_code, etype = CURSOR_ERRORS.get(facts.label, (code, ERROR_TYPES.get(code, "upstream_error")))
    text = facts.detail or facts.title or message or code
    err: JsonObject = {"message": text, "type": etype, "code": oa_code, "param": None}
    if facts.title:
        err["title"] = facts.title
    if facts.detail:
        err["detail"] = facts.detail
    if facts.label:
        err["cursor_error"] = facts.label
    if facts.retryable is not None:
        err["retryable"] = facts.retryable
    if details or oa_code != code:
        err["connect_code"] = code
        if message and message not in (text, "Error"):
            err["connect_message"] = message
    if details:
        err["details"] = list(details)
    return {"error": err}

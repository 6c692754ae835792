"""The tools an OpenAI client offered in its request, and whether a tool call it got fits one.

``bridge_tool_not_offered``: a bridge handed its client a tool call under a name the client never
offered, or with arguments that fit the offered tool's JSON schema nowhere (a required property
missing, a property the schema forbids, a value of the wrong basic type) — e.g. a client that
offered only ``get_weather(city)`` got ``get_weather`` with a shell command's arguments, because
the bridge mapped the agent's built-in shell call onto the one tool it had. The client then runs
the wrong tool or fails validation; the agent's call is lost either way. Only the schema's top
level is checked (``required``, ``additionalProperties: false``, ``type`` of each property).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from workbench.analysis.bridge_pair import BridgeFinding, Pair

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def offered_tools(payload: bytes | None) -> dict[str, Mapping[str, Any]] | None:
    """Tool name → its parameters schema, from a chat or responses request body; None when the
    body is not JSON (nothing to judge)."""
    try:
        doc = json.loads(payload) if payload else None
    except (ValueError, RecursionError):  # (not JSON, or nested past the parser's depth)
        return None
    if not isinstance(doc, dict):
        return None
    out: dict[str, Mapping[str, Any]] = {}
    tools = doc.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool  # chat | responses
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def _is_type(value: Any, name: str) -> bool:
    kinds = _TYPES.get(name)
    if kinds is None:
        return True  # a type this check does not know: not judged
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, kinds)


def schema_misfit(schema: Mapping[str, Any], arguments: str) -> str | None:
    """How ``arguments`` (JSON text) fail the schema's top level, or None when they fit (or do not
    parse: ``bridge_args_mismatch`` speaks for JSON that does not parse)."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return f"the arguments are a JSON {type(args).__name__}, not an object"
    found = schema.get("properties")
    props: Mapping[str, Any] = found if isinstance(found, dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    bits = []
    missing = [r for r in required if r not in args]
    if missing:
        bits.append("required " + ", ".join(missing) + " missing")
    if schema.get("additionalProperties") is False:
        unknown = sorted(k for k in args if k not in props)
        if unknown:
            bits.append("not in the schema: " + ", ".join(unknown))
    for key, value in args.items():
        spec = props.get(key)
        if not isinstance(spec, dict) or "type" not in spec:
            continue
        wanted = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        if not any(_is_type(value, str(t)) for t in wanted):
            bits.append(f"{key} is {type(value).__name__}, the schema wants {'/'.join(map(str, wanted))}")
    return "; ".join(bits) or None


def rule_not_offered(p: Pair) -> list[BridgeFinding]:
    if p.offered is None:
        return []
    out = []
    names = ", ".join(sorted(p.offered)) or "none"
    for cc in p.answer.calls:
        if cc.name not in p.offered:
            why = f"the client offered no tool named {cc.name!r} (it offered: {names})"
        else:
            misfit = schema_misfit(p.offered[cc.name], cc.arguments)
            if misfit is None:
                continue
            why = f"its arguments do not fit the schema of the client's {cc.name}: {misfit}"
        agent = {s.session_id: [int(c["first_seq"]) for c in s.calls if c.get("first_seq") is not None][:1]
                 for s in p.caused}
        out.append(BridgeFinding(
            "bridge_tool_not_offered", "error",
            f"tool call {cc.name} ({cc.call_id}) handed to the client: {why}; the agent asked for "
            + (", ".join(sorted({str(c.get('tool_name')) for s in p.caused for c in s.calls})) or "no tool"),
            "hand the client only tools it offered, with arguments its schema accepts; an agent call that maps "
            "to none of them is answered by the bridge itself (or refused with a throw), not handed out",
            cc.seqs, agent))
    return out

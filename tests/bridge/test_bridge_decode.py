"""The OpenAI side as frames: SSE events and whole bodies (``workbench.decode.openai``), routes,
redaction of credentials in OpenAI bodies through the write gate."""

from __future__ import annotations

import json

import pytest

from workbench.decode.classify import default_decoder
from workbench.protocol import kinds
from workbench.protocol.routes import Matcher
from workbench.redact import is_marker, redact_frame
from workbench.store.gate import gate_frame

CHAT_STREAM = (
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    b': keep-alive\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
    b'"function":{"name":"bash","arguments":"{\\"comm"}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\\":1}"}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n'
    b'data: [DONE]\n\n'
)
CHAT_KINDS = [kinds.OPENAI_ROLE, kinds.OPENAI_COMMENT, kinds.OPENAI_CONTENT, kinds.OPENAI_CONTENT,
              kinds.OPENAI_TOOL_CALLS, kinds.OPENAI_TOOL_CALLS, kinds.OPENAI_FINISH, kinds.OPENAI_USAGE,
              kinds.OPENAI_DONE]


@pytest.mark.parametrize("size", [1, 3, 7, 64, 10_000])
def test_sse_events_whatever_the_chunking(size: int) -> None:
    s = default_decoder().stream("openai_chat", "server")
    frames = []
    for i in range(0, len(CHAT_STREAM), size):
        frames += s.feed(CHAT_STREAM[i:i + size])
    frames += s.close()
    assert [f.kind for f in frames] == CHAT_KINDS
    assert frames[4].call_id == "call_1"
    assert "name=bash" in frames[4].summary
    assert frames[2].payload == b'{"choices":[{"index":0,"delta":{"content":"Hel"}}]}'


def test_sse_error_event_and_unterminated_last_event() -> None:
    body = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: {"error":{"message":"usage limit","type":"rate_limit"}}'
    frames = default_decoder().decode_body(body, "openai_chat", "server")
    assert [f.kind for f in frames] == [kinds.OPENAI_CONTENT, kinds.OPENAI_ERROR]
    assert frames[1].error == "rate_limit: usage limit"


def test_sse_data_that_is_not_json_keeps_its_bytes_with_an_error() -> None:
    frames = default_decoder().decode_body(b"data: {oops\n\n", "openai_chat", "server")
    assert frames[0].payload == b"{oops" and frames[0].error and "not JSON" in frames[0].error


def test_responses_events() -> None:
    body = b"".join(
        b"event: " + t.encode() + b"\ndata: " + json.dumps({"type": t, **extra}).encode() + b"\n\n"
        for t, extra in [("response.created", {}), ("response.output_text.delta", {"delta": "Hi"}),
                         ("response.output_item.added", {"item": {"type": "function_call", "call_id": "c9",
                                                                  "name": "read", "id": "fc1"}}),
                         ("response.function_call_arguments.delta", {"item_id": "fc1", "delta": "{}"}),
                         ("response.completed", {"response": {"status": "completed", "output": []}}),
                         ("response.failed", {"response": {"error": {"code": "server_error", "message": "boom"}}})])
    frames = default_decoder().decode_body(body, "openai_responses", "server")
    assert [f.kind for f in frames] == [kinds.OPENAI_EVENT, kinds.OPENAI_CONTENT, kinds.OPENAI_TOOL_CALLS,
                                        kinds.OPENAI_TOOL_CALLS, kinds.OPENAI_FINISH, kinds.OPENAI_ERROR]
    assert frames[2].call_id == "c9"
    assert frames[5].error == "server_error: boom"


def test_whole_bodies() -> None:
    dec = default_decoder()
    req = dec.decode_body(b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{}]}',
                          "openai_chat", "client")
    assert [f.kind for f in req] == [kinds.OPENAI_REQUEST]
    assert req[0].summary == 'request model=m 1 messages last user: "hi" 1 tools'
    ans = dec.decode_body(b'{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}', "openai_chat", "server")
    assert [f.kind for f in ans] == [kinds.OPENAI_RESPONSE] and "finish=stop" in ans[0].summary
    err = dec.decode_body(b'{"error":{"message":"bad key","code":"invalid_api_key"}}', "openai_chat", "server")
    assert err[0].kind == kinds.OPENAI_ERROR and err[0].error == "invalid_api_key: bad key"
    models = dec.decode_body(b'{"object":"list","data":[{"id":"a"},{"id":"b"}]}', "openai_models", "server")
    assert models[0].kind == kinds.OPENAI_MODELS and models[0].summary == "2 models"


def test_routes() -> None:
    m = Matcher()
    assert m.route("localhost", "/v1/chat/completions").transport == "openai_chat"  # type: ignore[union-attr]
    assert m.route("x", "/api/v1/chat/completions?x=1").transport == "openai_chat"  # type: ignore[union-attr]
    assert m.route("x", "/v1/responses").transport == "openai_responses"  # type: ignore[union-attr]
    assert m.route("x", "/v1/models").transport == "openai_models"  # type: ignore[union-attr]
    assert m.route("x", "/v1/files") is None
    assert m.route("x", "/agent.v1.AgentService/Run").transport == "run"  # type: ignore[union-attr]


def test_credentials_in_a_request_body_never_stored() -> None:
    body = json.dumps({"model": "m", "api_key": "sk-live-SECRET", "extra_body": {"apiKey": "sk-2-SECRET",
                       "client_secret": "cs-SECRET"}, "messages": [{"role": "user", "content": "hi"}]}).encode()
    f = default_decoder().decode_body(body, "openai_chat", "client")[0]
    gated = gate_frame(f)
    assert b"SECRET" not in gated.payload
    doc = json.loads(gated.payload)
    assert is_marker(doc["api_key"]) and is_marker(doc["extra_body"]["apiKey"])
    assert doc["messages"][0]["content"] == "hi"  # content is kept at the secrets level
    again = gate_frame(gated)
    assert again.payload == gated.payload  # idempotent


def test_unparsable_request_body_stored_as_a_hash_and_content_level() -> None:
    dec = default_decoder()
    f = gate_frame(dec.decode_body(b"api_key=sk-SECRET&x", "openai_chat", "client")[0])
    assert is_marker(f.payload.decode())
    f = redact_frame(dec.decode_body(b'{"messages":[{"role":"user","content":"my prompt"}]}', "openai_chat",
                                     "client")[0], content=True)
    assert b"my prompt" not in f.payload and "my prompt" not in f.summary


def test_every_openai_kind_constant_is_what_the_decoder_produces() -> None:
    """A typo in a constant would silently match nothing: each ``OPENAI_*`` kind comes out of a sample."""
    dec = default_decoder()
    seen = {f.kind for f in dec.decode_body(CHAT_STREAM, "openai_chat", "server")}
    seen |= {f.kind for f in dec.decode_body(b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n'
                                             b'data: {"error":{"message":"x"}}\n\nevent: response.created\n'
                                             b'data: {"type":"response.created"}\n\n', "openai_chat", "server")}
    seen |= {f.kind for f in dec.decode_body(b'{"choices":[]}', "openai_chat", "server")}
    seen |= {f.kind for f in dec.decode_body(b'{"object":"list","data":[]}', "openai_models", "server")}
    seen |= {f.kind for f in dec.decode_body(b'{"model":"m"}', "openai_chat", "client")}
    constants = {v for k, v in vars(kinds).items() if k.startswith("OPENAI_") and isinstance(v, str)}
    assert constants <= seen, constants - seen

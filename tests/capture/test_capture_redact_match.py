"""Redaction helpers and the flow matcher."""

from __future__ import annotations

import binascii
import json

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.protocol.routes import Matcher
from workbench.redact import (
    bearer_hash,
    marker,
    redact_blob,
    redact_frame,
    redact_headers,
    redact_payload,
    short_hash,
)
from workbench.schema import pb


def test_markers_are_short_stable_hashes() -> None:
    assert short_hash("abc") == short_hash(b"abc") == "ba7816bf8f01"
    assert marker("abc") == "[redacted sha256:ba7816bf8f01]"
    assert bearer_hash("Bearer tok") == short_hash("tok")
    assert bearer_hash(None) is None


def test_redact_headers_keeps_names_and_order() -> None:
    out = redact_headers([("Authorization", "Bearer tok"), ("Cookie", "c=1"), ("x-request-id", "r"),
                          ("X-Cursor-Checksum", "cs"), ("x-client-key", "k"), ("x-my-token", "t")])
    assert [n for n, _ in out] == ["Authorization", "Cookie", "x-request-id", "X-Cursor-Checksum", "x-client-key",
                                   "x-my-token"]
    assert out[0][1] == "Bearer " + marker("tok")
    assert out[2][1] == "r"
    assert all("redacted" in v for n, v in out if n != "x-request-id")


def _run(**creds: object) -> bytes:
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        model_details=pb.ModelDetails(model_id="m", azure_credentials=pb.AzureCredentials(
            api_key="AZKEY", base_url="https://x.openai.azure.com", deployment="dep")),
        requested_model=pb.RequestedModel(model_id="m", bedrock_credentials=pb.BedrockCredentials(
            access_key="AKIA1", secret_key="SK1", session_token="ST1", region="eu-west-1")),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="the prompt")))),
    ).SerializeToString()


def test_model_credentials_always_hidden_content_kept() -> None:
    out = redact_payload(_run(), CLIENT_MSG)
    for secret in (b"AZKEY", b"AKIA1", b"SK1", b"ST1"):
        assert secret not in out
    msg = pb.AgentClientMessage.FromString(out)
    assert msg.run_request.requested_model.bedrock_credentials.region == "eu-west-1"
    assert msg.run_request.model_details.azure_credentials.deployment == "dep"
    assert b"the prompt" in out


def test_frames_without_secrets_are_untouched() -> None:
    hb = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString()
    assert redact_payload(hb, CLIENT_MSG) is hb
    srv = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="x")))
    data = srv.SerializeToString()
    assert redact_payload(data, SERVER_MSG) is data


def test_append_wrapper_rebuilt_around_redacted_message() -> None:
    body = pb.BidiAppendRequest(data=binascii.hexlify(_run()).decode(), request_id=pb.BidiRequestId(request_id="r"),
                                append_seqno=0).SerializeToString()
    f = redact_frame(default_decoder().unwrap_append(body))
    assert binascii.hexlify(b"AZKEY") not in (f.raw or b"")
    assert b"AZKEY" not in f.payload
    inner = default_decoder().unwrap_append(f.raw or b"")
    assert inner.payload == f.payload
    assert inner.kind == "run_request"


def test_content_level_blanks_prompts_and_blobs() -> None:
    out = redact_payload(_run(), CLIENT_MSG, content=True)
    assert b"the prompt" not in out
    blob = json.dumps({"role": "user", "content": [{"type": "text", "text": "secret plan"}]}).encode()
    red = json.loads(redact_blob(blob))
    assert red["role"] == "user"
    assert red["content"][0]["text"] == marker("secret plan")
    assert redact_blob(b"plain file body") == marker(b"plain file body").encode()
    kv = pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
        id=3, set_blob_args=pb.SetBlobArgs(blob_id=b"\x01\x02", blob_data=blob))).SerializeToString()
    f = redact_frame(default_decoder().classify_agent(kv, SERVER_MSG), content=True)
    assert b"secret plan" not in f.payload
    assert f.kind == "kv_server_message.set_blob_args"


def test_matcher_routes() -> None:
    m = Matcher()
    assert m.route("127.0.0.1", "/agent.v1.AgentService/Run").transport == "run"  # type: ignore[union-attr]
    assert m.route("localhost", "/agent.v1.AgentService/RunSSE").transport == "runsse"  # type: ignore[union-attr]
    r = m.route("x", "/aiserver.v1.BidiService/BidiAppend")
    assert r is not None
    assert r.transport == "bidi_append"
    assert not r.streaming
    u = m.route("api2.cursor.sh", "/aiserver.v1.ServerConfigService/GetServerConfig")
    assert u is not None
    assert u.transport == "unary"
    assert u.request_type == "aiserver.v1.GetServerConfigRequest"
    assert m.route("api2.cursor.sh", "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE").streaming  # type: ignore[union-attr]
    assert m.route("api2.cursor.sh", "/auth/poll") is None  # login tokens: left alone
    assert m.route("example.com", "/aiserver.v1.AiService/AvailableModels") is None
    # the model listing stateless proxies use (mode D) is recorded on any host, like the agent paths
    ai = m.route("127.0.0.1", "/aiserver.v1.AiService/GetUsableModels")
    assert ai is not None and ai.transport == "unary" and not ai.streaming
    assert Matcher("*.corp", "/x/*").route("a.corp", "/aiserver.v1.AiService/AvailableModels") is not None

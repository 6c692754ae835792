"""Framing negotiated per request: Connect, gRPC-Web (binary and text) and gRPC, on every path.

Our own raw requests check the exact bytes (415s, envelopes, 0x80 trailer frames, HTTP/2 trailers);
``connect-python`` (its Connect, gRPC-Web and gRPC clients over pyqwest, a Rust HTTP stack) checks
that code we did not write reads every framing the same way, including grpc-status-details-bin.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_h2 import H2Client, RunSession, open_run, run_request
from sim_http1 import APPEND, AUTH, RUNSSE, BidiRun, append_body, http1

from workbench.decode import default_decoder
from workbench.schema import pb
from workbench.transport.framing import GRPC_WEB_TEXT, Framing, RequestDecoder
from workbench.wire.endstream import (
    end_from_grpc,
    grpc_trailers,
    grpc_web_trailer_payload,
    parse_grpc_web_trailer,
)
from workbench.wire.envelope import FLAG_TRAILER, encode, split_frames

connectrpc = pytest.importorskip("connectrpc")
pyqwest = pytest.importorskip("pyqwest")

from connectrpc.client import ConnectClient  # noqa: E402
from connectrpc.errors import ConnectError  # noqa: E402
from connectrpc.method import IdempotencyLevel, MethodInfo  # noqa: E402
from connectrpc.protocol import ProtocolType  # noqa: E402

GRPC_WEB = "application/grpc-web+proto"
HB = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat())


def trailer_of(body: bytes) -> dict[str, str]:
    [t] = [e for e in split_frames(body) if e.is_trailer]
    return parse_grpc_web_trailer(t.payload)


# BidiAppend: one live run, appends in every unary framing --------------------------------------


@pytest.mark.slow
async def test_bidi_append_accepts_every_unary_framing_and_415s_exactly_where_connect_does(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with http1(sim) as http:
        run = BidiRun(http, sim.url)
        await run.start()
        rid = run.request_id

        async def post(body: bytes, ctype: str) -> httpx.Response:
            return await http.post(sim.url + APPEND, content=body, headers={**AUTH, "content-type": ctype})

        first = pb.AgentClientMessage.FromString(run_request("[scenario:text] every framing"))
        r = await post(append_body(rid, 0, first), "application/proto")  # Connect unary: bare
        assert r.status_code == 200
        assert r.content == b""
        # The two 415s: an envelope sent as Connect unary, and connect+proto on a unary method.
        assert (await post(encode(append_body(rid, 1, HB)), "application/proto")).status_code == 415
        assert (await post(append_body(rid, 1, HB), "application/connect+proto")).status_code == 415
        assert (await post(encode(append_body(rid, 1, HB)), "application/connect+proto")).status_code == 415
        assert (await post(append_body(rid, 1, HB), "text/plain")).status_code == 415
        # gRPC-Web: enveloped by design, answered with an (empty) message and a 0x80 trailer frame.
        r = await post(encode(append_body(rid, 1, HB)), GRPC_WEB)
        assert r.status_code == 200
        assert r.headers["content-type"] == GRPC_WEB
        envs = split_frames(r.content)
        assert [(e.flags, e.payload) for e in envs[:-1]] == [(0, b"")]
        assert envs[-1].flags == FLAG_TRAILER
        assert trailer_of(r.content) == {"grpc-status": "0"}
        # gRPC-Web text: the same bytes in base64 both ways.
        r = await post(base64.b64encode(encode(append_body(rid, 2, HB))), "application/grpc-web-text")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/grpc-web-text+proto"
        assert trailer_of(base64.b64decode(r.content[:8]) + base64.b64decode(r.content[8:])) == {"grpc-status": "0"}
        # Connect JSON unary.
        doc = {"data": HB.SerializeToString().hex(), "requestId": {"requestId": rid}, "appendSeqno": "3"}
        r = await post(json.dumps(doc).encode(), "application/json")
        assert r.status_code == 200
        assert r.json() == {}
        # A bare body under gRPC-Web breaks its own framing: answered in that framing, not 415.
        r = await post(append_body(rid, 4, HB), GRPC_WEB)
        assert r.status_code == 200
        assert trailer_of(r.content)["grpc-status"] == "3"
        # An unknown request id: not_found, as gRPC status 5 for a gRPC-Web caller.
        r = await post(encode(append_body("no-such-run", 0, HB)), GRPC_WEB)
        assert trailer_of(r.content)["grpc-status"] == "5"
        assert "no-such-run" in trailer_of(r.content)["grpc-message"]
        run.seqno = 4  # seqnos 0-3 were taken above; the KV answers go on from there
        frames = await run.until_end()
    assert frames[-2].kind == "interaction_update.turn_ended"
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.client_kinds[:4] == ["run_request", "client_heartbeat", "client_heartbeat", "client_heartbeat"]
    assert not rec.faults


# streams --------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_runsse_in_grpc_web_text(sim_factory: Any, tmp_path: Any) -> None:
    (tmp_path / "short.json").write_text('{"steps": [{"text": "text over base64", "chunks": 3}, {"end": "ok"}]}')
    sim = await sim_factory(append_grace=5, scenario_dirs=[tmp_path])
    rid = str(uuid.uuid4())
    body = base64.b64encode(encode(pb.BidiRequestId(request_id=rid).SerializeToString()))
    async with http1(sim) as http:
        async def appender() -> None:
            first = pb.AgentClientMessage.FromString(run_request("[scenario:short] text please"))
            r = await http.post(sim.url + APPEND, content=base64.b64encode(encode(append_body(rid, 0, first))),
                                headers={**AUTH, "content-type": "application/grpc-web-text"})
            assert r.status_code == 200

        task = asyncio.get_running_loop().create_task(appender())
        r = await http.post(sim.url + RUNSSE, content=body,
                            headers={**AUTH, "content-type": "application/grpc-web-text+proto", "x-request-id": rid})
        await task
    assert r.headers["content-type"] == "application/grpc-web-text+proto"
    dec = RequestDecoder(Framing(GRPC_WEB_TEXT))  # each write is its own padded base64 run
    raw = dec.feed(r.content) + dec.close()
    frames = default_decoder().decode_body(raw, "runsse", "server")
    kinds = [f.kind for f in frames]
    assert "interaction_update.text_delta" in kinds
    assert kinds[-1] == "end_stream"  # a grpc-status 0 trailer
    assert split_frames(raw)[-1].flags == FLAG_TRAILER
    assert "end_stream" not in kinds[:-1]  # no Connect end-stream in a gRPC-Web answer


@pytest.mark.slow
async def test_unary_content_types_on_streams_get_415(sim_factory: Any) -> None:
    sim = await sim_factory()
    body = encode(pb.BidiRequestId(request_id=str(uuid.uuid4())).SerializeToString())
    async with http1(sim) as http:
        for ctype in ("application/proto", "application/json"):
            r = await http.post(sim.url + RUNSSE, content=body, headers={**AUTH, "content-type": ctype})
            assert r.status_code == 415
    client = await H2Client.connect(sim.url, sim.cert_path)
    s = await RunSession.open(client, extra={"content-type": "application/proto"})
    await s.stream.headers_ready.wait()
    assert s.stream.headers[":status"] == "415"
    await client.close()


@pytest.mark.slow
async def test_grpc_run_ends_with_real_http2_trailers(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim, **{"content-type": "application/grpc"})
    await s.send(run_request("[scenario:text] over grpc"))
    await s.until("interaction_update.turn_ended")
    await s.stream.end()
    assert [f async for f in _drain(s)] == []  # nothing after turn_ended: no end-stream envelope
    assert s.stream.headers["content-type"] == "application/grpc+proto"
    assert s.stream.trailers == {"grpc-status": "0"}

    _, s = await open_run(sim, **{"content-type": "application/grpc"})  # an error: status in trailers
    await s.send(run_request("bad model", model="no-such-model"))
    assert [f async for f in _drain(s)] == []  # no end-stream envelope in the body
    t = s.stream.trailers
    assert t["grpc-status"] == "5"
    assert t["grpc-message"] == "Error"
    status = pb.RpcStatus.FromString(base64.b64decode(t["grpc-status-details-bin"] + "=="))
    assert status.code == 5
    assert status.details[0].type_url == "type.googleapis.com/aiserver.v1.ErrorDetails"
    assert pb.ErrorDetails.FromString(status.details[0].value).error == 5  # ERROR_BAD_MODEL_NAME
    await client.close()


async def _drain(s: RunSession) -> Any:
    while (f := await s.next()) is not None:
        yield f


# independent clients: connect-python -------------------------------------------------------------


def _client(sim: Any, protocol: ProtocolType, json_codec: bool = False) -> ConnectClient:
    version = pyqwest.HTTPVersion.HTTP2 if protocol == ProtocolType.GRPC else pyqwest.HTTPVersion.HTTP1
    transport = pyqwest.HTTPTransport(tls_ca_cert=sim.cert_path.read_bytes(), http_version=version)
    return ConnectClient(sim.url, protocol=protocol, proto_json=json_codec, http_client=pyqwest.Client(transport),
                         send_compression=None, accept_compression=[])


def _method(service: str, name: str, request: Any, response: Any) -> MethodInfo:
    return MethodInfo(name=name, service_name=service, input=request, output=response,
                      idempotency_level=IdempotencyLevel.UNKNOWN)


LISTINGS = [("agent.v1.AgentService", pb.GetUsableModelsRequest, pb.GetUsableModelsResponse),
            ("aiserver.v1.AiService", pb.message("aiserver.v1.GetUsableModelsRequest"),
             pb.message("aiserver.v1.GetUsableModelsResponse"))]
PROTOCOLS = [(ProtocolType.CONNECT, False), (ProtocolType.CONNECT, True), (ProtocolType.GRPC_WEB, False),
             (ProtocolType.GRPC, False)]


@pytest.mark.slow
@pytest.mark.parametrize(("protocol", "json_codec"), PROTOCOLS, ids=["connect", "connect-json", "grpc-web", "grpc"])
async def test_connect_python_reads_both_model_listings(sim_factory: Any, protocol: ProtocolType,
                                                       json_codec: bool) -> None:
    sim = await sim_factory(models=["default", "gpt-5", "composer-1"])
    client = _client(sim, protocol, json_codec)
    for service, req, resp in LISTINGS:
        got = await client.execute_unary(request=req(), method=_method(service, "GetUsableModels", req, resp),
                                         headers=AUTH)
        assert [m.model_id for m in got.models] == ["default", "gpt-5", "composer-1"]
        assert got.models[1].display_name == "Gpt 5"
    with pytest.raises(ConnectError) as info:  # the error in the same framing, details included
        await client.execute_unary(request=LISTINGS[1][1](), method=_method(
            LISTINGS[1][0], "GetUsableModels", LISTINGS[1][1], LISTINGS[1][2]))
    assert info.value.code.name == "UNAUTHENTICATED"
    [detail] = info.value.details
    assert detail.type_url == "type.googleapis.com/aiserver.v1.ErrorDetails"
    assert pb.ErrorDetails.FromString(detail.value).error == 2  # ERROR_NOT_LOGGED_IN
    with pytest.raises(ConnectError) as info:
        await client.execute_unary(request=pb.GetUsableModelsRequest(), headers=AUTH, method=_method(
            "agent.v1.AgentService", "NoSuchRpc", pb.GetUsableModelsRequest, pb.GetUsableModelsResponse))
    assert info.value.code.name == "UNIMPLEMENTED"


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [ProtocolType.GRPC_WEB, ProtocolType.GRPC], ids=["grpc-web", "grpc"])
async def test_connect_python_server_stream_error_trailers(sim_factory: Any, protocol: ProtocolType) -> None:
    """A RunSSE refused at once (no token) ends with the status in the caller's trailers."""
    sim = await sim_factory()
    sse = _method("agent.v1.AgentService", "RunSSE", pb.BidiRequestId, pb.AgentServerMessage)
    with pytest.raises(ConnectError) as info:
        async for _ in _client(sim, protocol).execute_server_stream(request=pb.BidiRequestId(request_id="r"),
                                                                    method=sse):
            pass
    assert info.value.code.name == "UNAUTHENTICATED"
    assert info.value.message == "Not logged in"
    assert pb.ErrorDetails.FromString(info.value.details[0].value).details.title == "Not logged in"


@pytest.mark.slow
async def test_connect_python_drives_a_grpc_run_full_duplex(sim_factory: Any) -> None:
    """gRPC Run over HTTP/2: a third-party client needs the grpc-status trailer to accept the end."""
    sim = await sim_factory()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    queue.put_nowait(pb.AgentClientMessage.FromString(run_request("[scenario:text] duplex")))

    async def requests() -> Any:
        while (m := await queue.get()) is not None:
            yield m

    text = ""
    run = _method("agent.v1.AgentService", "Run", pb.AgentClientMessage, pb.AgentServerMessage)
    async for msg in _client(sim, ProtocolType.GRPC).execute_bidi_stream(request=requests(), method=run,
                                                                         headers=AUTH):
        if msg.WhichOneof("message") == "kv_server_message":
            kv = msg.kv_server_message
            res = pb.KvClientMessage(id=kv.id, set_blob_result=pb.SetBlobResult()) \
                if kv.WhichOneof("args") == "set_blob_args" else pb.KvClientMessage(id=kv.id,
                                                                                   get_blob_result=pb.GetBlobResult())
            queue.put_nowait(pb.AgentClientMessage(kv_client_message=res))
        elif msg.interaction_update.WhichOneof("message") == "text_delta":
            text += msg.interaction_update.text_delta.text
        elif msg.interaction_update.WhichOneof("message") == "turn_ended":
            queue.put_nowait(None)
    assert text.endswith("You said: duplex")
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert not rec.faults


# codecs --------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(payloads=st.lists(st.binary(max_size=40), max_size=5), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_grpc_web_text_decoder_survives_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(encode(p) for p in payloads)
    text = b"".join(base64.b64encode(encode(p)) for p in payloads)  # one padded run per write
    dec = RequestDecoder(Framing(GRPC_WEB_TEXT))
    out = b""
    pos = 0
    for cut in sorted(c for c in cuts if c <= len(text)):
        out += dec.feed(text[pos:cut])
        pos = cut
    out += dec.feed(text[pos:]) + dec.close()
    assert out == wire


@settings(max_examples=150, deadline=None)
@given(code=st.sampled_from(["not_found", "resource_exhausted", "internal", "unauthenticated", None]),
       message=st.text(max_size=60))
def test_grpc_trailer_round_trip(code: str | None, message: str) -> None:
    payload = grpc_web_trailer_payload(grpc_trailers(code, message))
    payload.decode("ascii")  # header-safe
    end = end_from_grpc(parse_grpc_web_trailer(payload))
    assert end.code == code
    if code is not None:
        assert (end.message or "") == message.strip() or (end.message or "") == message

"""RunSSE/RunPoll + BidiAppend over HTTP/1.1 (httpx, TLS), GetUsableModels and HTTP-level errors."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import pytest
from sim_h2 import run_request
from sim_http1 import APPEND, AUTH, MODELS, RUNSSE, BidiRun, append_body, http1, trust

from workbench.decode import default_decoder, fields_of
from workbench.schema import pb
from workbench.wire.envelope import encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers


async def test_runsse_full_turn(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with http1(sim) as http:
        run = BidiRun(http, sim.url)
        await run.start()
        assert run.status == 200
        assert run.content_type == "application/connect+proto"
        r = await run.append(pb.AgentClientMessage.FromString(run_request("over http/1.1")))
        assert r.status_code == 200
        assert r.content == b""
        frames = await run.until_end()
    kinds = [f.kind for f in frames]
    assert kinds[0] == "kv_server_message.set_blob_args"
    assert kinds[-2:] == ["interaction_update.turn_ended", "end_stream"]
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.transport == "runsse"
    assert rec.request_id == run.request_id
    assert rec.outcome == "turn_ended"
    assert not rec.faults


async def test_runsse_event_stream_label(sim_factory: Any) -> None:
    """A client that asks for text/event-stream gets that label, but still binary envelopes."""
    sim = await sim_factory()
    body = encode(pb.BidiRequestId(request_id=str(uuid.uuid4())).SerializeToString())
    async with http1(sim) as http:  # no token: the stream ends at once with the auth error
        r = await http.post(sim.url + RUNSSE, content=body, headers={
            "content-type": "application/connect+proto", "accept": "text/event-stream"})
    assert r.headers["content-type"] == "text/event-stream"
    assert [f.kind for f in default_decoder().decode_body(r.content, "runsse", "server")] == ["end_stream.error"]


async def test_runsse_appends_out_of_order(sim_factory: Any) -> None:
    """Appends 2 and 1 arrive before 0: the server holds them and reads in seqno order."""
    sim = await sim_factory(scenario="tool_flow")
    async with http1(sim) as http:
        run = BidiRun(http, sim.url)
        await run.start()
        hb = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat())
        first = pb.AgentClientMessage.FromString(run_request("ordered please"))
        assert (await run.append(hb, seqno=2)).status_code == 200
        assert (await run.append(hb, seqno=1, raw_field4=True)).status_code == 200
        assert (await run.append(first, seqno=0)).status_code == 200
        run.seqno = 3
        f = await run.next()
        assert f is not None
        assert f.kind == "kv_server_message.set_blob_args"
        rec = sim.state.runs[0]
        assert rec.client_kinds[:3] == ["run_request", "client_heartbeat", "client_heartbeat"]
        await run.close()


async def test_runpoll_records(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with http1(sim) as http:
        run = BidiRun(http, sim.url, transport="runpoll")
        await run.start()
        await run.append(pb.AgentClientMessage.FromString(run_request("polling")))
        frames = await run.until_end()
    records = [pb.BidiPollResponse.FromString(f.raw) for f in frames if f.raw is not None]
    assert [r.seqno for r in records] == list(range(len(records)))
    assert records[-1].eof
    assert not records[-1].data
    assert not any(r.eof for r in records[:-1])
    first = pb.AgentServerMessage.FromString(base64.b64decode(records[0].data))
    assert first.WhichOneof("message") == "kv_server_message"
    assert "interaction_update.turn_ended" in [f.kind for f in frames]
    assert frames[-1].kind == "end_stream"


async def test_append_errors(sim_factory: Any) -> None:
    sim = await sim_factory(append_grace=0.1)
    async with http1(sim) as http:
        hb = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat())
        r = await http.post(sim.url + APPEND, content=append_body("no-such-run", 0, hb),
                            headers={**AUTH, "content-type": "application/proto"})
        assert r.status_code == 404
        assert r.json()["code"] == "not_found"
        assert "no-such-run" in r.json()["message"]
        r = await http.post(sim.url + APPEND, content=encode(append_body("x", 0, hb)),
                            headers={**AUTH, "content-type": "application/connect+proto"})
        assert r.status_code == 415
        r = await http.post(sim.url + APPEND, content=append_body("x", 0, hb),
                            headers={"content-type": "application/proto"})
        assert r.status_code == 401
        assert r.json()["code"] == "unauthenticated"
        r = await http.post(sim.url + "/agent.v1.AgentService/Run", content=b"",
                            headers={**AUTH, "content-type": "application/connect+proto"})
        assert r.status_code == 464  # Run is h2-only, like the real load balancer


async def test_runsse_auth_error_is_end_stream(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with http1(sim) as http:
        body = encode(pb.BidiRequestId(request_id=str(uuid.uuid4())).SerializeToString())
        r = await http.post(sim.url + RUNSSE, content=body, headers={"content-type": "application/connect+proto"})
    assert r.status_code == 200
    frames = default_decoder().decode_body(r.content, "runsse", "server")
    assert [f.kind for f in frames] == ["end_stream.error"]
    tree = fields_of(default_decoder(), frames[0].kind, frames[0].payload, None, frames[0].flags)
    assert tree["error"]["code"] == "unauthenticated"
    assert tree["error"]["details"][0]["value"]["error"] == "ERROR_NOT_LOGGED_IN"


async def test_get_usable_models(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with httpx.AsyncClient(http2=True, verify=trust(sim)) as http:
        r = await http.post(sim.url + MODELS, content=b"", headers={**AUTH, "content-type": "application/proto"})
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200
        ids = [m.model_id for m in pb.GetUsableModelsResponse.FromString(r.content).models]
        assert {"default", "claude-4-sonnet", "gpt-5", "composer-1"} <= set(ids)
        assert r.content.startswith(b"\x0a")  # field 1, repeated ModelDetails
        r = await http.post(sim.url + "/aiserver.v1.AiService/GetUsableModels", content=b'{"customModelIds": []}',
                            headers={**AUTH, "content-type": "application/json"})
        assert r.json()["models"][0] == {"modelId": "default", "displayModelId": "default",
                                         "displayName": "Default", "displayNameShort": "Default"}
        r = await http.post(sim.url + MODELS, content=b"{}", headers={**AUTH, "content-type": "application/json"})
        assert "gpt-5" in [m["modelId"] for m in json.loads(r.content)["models"]]
        r = await http.post(sim.url + "/aiserver.v1.ServerConfigService/GetServerConfig", content=b"",
                            headers={**AUTH, "content-type": "application/proto"})
        assert r.status_code == 200
        assert pb.GetServerConfigResponse.FromString(r.content).http2_config == 0
        r = await http.post(sim.url + "/agent.v1.AgentService/NoSuchRpc", content=b"",
                            headers={**AUTH, "content-type": "application/proto"})
        assert r.status_code == 501
        assert r.json()["code"] == "unimplemented"
        r = await http.post(sim.url + MODELS, content=b"", headers={"content-type": "application/proto"})
        assert r.status_code == 401
        assert r.json()["details"][0]["debug"]["error"] == "ERROR_NOT_LOGGED_IN"

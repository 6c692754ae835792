"""The scenarios that reproduce the failures bridge authors reported (pi-cursor #3, #13, #25,
1.4.17; oh-my-pi #6176, #9479; senpi #1062), checked on the wire with a raw HTTP/2 client over TLS
on loopback (``sim_h2``): the reset after turn_ended, the heartbeats after it, the wrong length
prefix, the unknown exec case, the empty blob answer, the non-200 status, the arguments that come
only in tool_call_started, the long exec's command. Their healthy twins alongside."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sim_h2 import (
    RUN,
    H2Client,
    RunSession,
    frames_until_heartbeats,
    open_run,
    run_request,
    server_msg,
)

from workbench.decode import default_decoder
from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, encode

pytestmark = pytest.mark.slow  # starts servers


def kinds_of(frames: list[Any]) -> list[str]:
    return [f.kind for f in frames]


async def rest_of(s: RunSession) -> list[Any]:
    out = []
    while (f := await s.next()) is not None:
        out.append(f)
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
    return out


async def test_reset_after_turn_resets_the_stream_after_turn_ended(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:reset_after_turn] hi"))
    await s.until("interaction_update.turn_ended")
    assert await s.next() is None  # no end-stream frame: the stream was reset
    assert s.stream.reset and s.stream.reset_code == 2  # RST_STREAM INTERNAL_ERROR
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    # a new run on the same conversation (what a retry is) gets a clean turn
    s2 = await RunSession.open(client)
    await s2.send(run_request("[scenario:reset_after_turn] hi", conversation_id=rec.conversation_id))
    frames = await rest_of(s2)
    assert kinds_of(frames)[-2:] == ["interaction_update.turn_ended", "end_stream"]
    assert not s2.stream.reset
    assert (await sim.state.finished_runs(2))[1].path == "continuation"
    await client.close()


async def test_held_open_after_turn_heartbeats_then_ends(sim_factory: Any) -> None:
    sim = await sim_factory(heartbeat_interval=0.05)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:held_open_after_turn] hi"))
    await s.until("interaction_update.turn_ended")
    after = await rest_of(s)
    assert kinds_of(after) == ["interaction_update.heartbeat"] * 3 + ["end_stream"]
    assert not s.stream.reset
    await client.close()


P = bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    text_delta=pb.TextDelta(text="This frame's length prefix is wrong."))).SerializeToString())


async def test_bad_length_prefix_puts_the_rest_of_the_turn_out_of_sync(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:bad_length_prefix] hi"))
    raw = bytearray()
    pos = 0
    declared = None
    at = None
    after: list[bytes] = []  # the envelopes after the broken one, read at their true boundaries
    while (chunk := await s.stream.read()) is not None:
        raw += chunk
        while len(raw) - pos >= 5:
            size = int.from_bytes(raw[pos + 1:pos + 5], "big")
            if raw[pos + 5:pos + 5 + len(P)] == P and declared is None:
                declared, at = size, pos
                pos += 5 + len(P)  # its true end: where the next envelope really starts
                continue
            if len(raw) - pos < 5 + size:
                break
            flags, payload = raw[pos], bytes(raw[pos + 5:pos + 5 + size])
            pos += 5 + size
            if declared is not None:
                after.append(payload)
            if flags & FLAG_END_STREAM:
                continue
            msg = pb.AgentServerMessage.FromString(payload)
            if msg.WhichOneof("message") == "kv_server_message" and declared is None:
                kv = msg.kv_server_message
                res = pb.KvClientMessage(id=kv.id, set_blob_result=pb.SetBlobResult())
                await s.send(pb.AgentClientMessage(kv_client_message=res))
    assert declared == len(P) + 5  # the prefix claims 5 bytes the envelope does not have
    # everything after it is there on the wire, turn_ended included …
    kinds = [pb.AgentServerMessage.FromString(p).interaction_update.WhichOneof("message") for p in after[:-1]]
    assert "turn_ended" in kinds and after[-1] == b"{}"
    # … but a reader that follows the prefix is out of sync: our own decoder reports malformed frames
    frames = default_decoder().stream("run", "server")
    decoded = frames.feed(bytes(raw)) + frames.close()
    assert "interaction_update.turn_ended" not in [f.kind for f in decoded]
    assert any(f.kind == "malformed" or f.error for f in decoded)
    assert at is not None and at > 0
    assert connect_python_reads(bytes(raw)) is False  # a third-party Connect reader loses it too …
    healthy = b"".join(encode(p) for p in after[:-1])  # … and reads the same frames correctly framed
    assert connect_python_reads(healthy) is True
    rec = (await sim.state.finished_runs(1))[0]
    assert "text_delta (bad length prefix)" in rec.sent_kinds and rec.outcome == "turn_ended"
    await client.close()


def connect_python_reads(wire: bytes) -> bool | None:
    """Whether connect-python's envelope reader finds the turn_ended in ``wire`` (None: not installed)."""
    try:
        from connectrpc._codec import ProtoBinaryCodec
        from connectrpc._compression import IdentityCompression
        from connectrpc._protocol_connect import ConnectEnvelopeReader
    except ImportError:
        return None
    reader = ConnectEnvelopeReader(pb.AgentServerMessage, ProtoBinaryCodec(), IdentityCompression(), None)
    seen = []
    try:
        seen = list(reader.feed(wire))
    except Exception:  # noqa: BLE001 - whatever it raises, it did not read on
        pass
    return any(m.interaction_update.HasField("turn_ended") for m in seen)


async def test_unknown_exec_case_parks_until_thrown(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    s.allow_unknown_members = True
    await s.send(run_request("[scenario:unknown_exec_case] hi"))
    raw_esm = None
    while raw_esm is None:
        f = await s.next()
        assert f is not None
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
        elif f.kind.startswith("exec_server_message"):
            raw_esm = f
    assert raw_esm.kind == "exec_server_message.56"  # our decoder names the unknown case by its number
    esm = server_msg(raw_esm).exec_server_message
    assert esm.WhichOneof("args") is None  # no case this schema knows …
    assert b"\xc2\x03" in bytes(esm.SerializeToString())  # … but field 56, length-delimited (tag 450)
    # unanswered: the server waits with heartbeats
    assert set(kinds_of(await frames_until_heartbeats(s))) == {"interaction_update.heartbeat"}
    await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        throw=pb.ExecClientThrow(id=esm.id, error="unknown exec case", error_code="UNIMPLEMENTED"))))
    rest = await rest_of(s)
    assert "interaction_update.turn_ended" in kinds_of(rest)
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.execs[0].kind == "unknown_56" and rec.execs[0].thrown == "unknown exec case"
    await client.close()


async def test_unknown_exec_case_never_answered_hits_the_park_timeout(sim_factory: Any) -> None:
    sim = await sim_factory(park_timeout=0.5)
    client, s = await open_run(sim)
    s.allow_unknown_members = True
    await s.send(run_request("[scenario:unknown_exec_case] hi"))
    rest = await rest_of(s)
    assert rest[-1].kind == "end_stream.error"
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "park timeout waiting for exec 1 (unknown_56) result"
    await client.close()


@pytest.mark.parametrize("keep", [True, False])
async def test_empty_blob_answer(sim_factory: Any, keep: bool) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:empty_blob_answer] hi"))
    store: dict[bytes, bytes] = {}
    while (f := await s.next()) is not None:
        if f.kind == "kv_server_message.set_blob_args" and not keep:
            await s.answer_kv(f, {})  # acknowledged, not kept: the get_blob is answered empty
        elif f.kind.startswith("kv_server_message"):
            await s.answer_kv(f, store)
    rec = (await sim.state.finished_runs(1))[0]
    assert "get_blob_args" in rec.sent_kinds and rec.outcome == "turn_ended"
    assert len(rec.blob_misses) == (0 if keep else 1)
    if not keep:
        assert rec.blob_misses[0].startswith("set by this run ")
    await client.close()


async def test_run_http_error_answers_503_by_marker_header_and_default(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:run_http_error] hi"))
    body = await s.stream.read_all()
    assert s.stream.headers[":status"] == "503"
    assert json.loads(body)["code"] == "unavailable"
    # the read-ahead of a Run that picks another scenario is handed on untouched
    s2 = await RunSession.open(client)
    await s2.send(run_request("[scenario:text] hi"))
    assert kinds_of(await rest_of(s2))[-1] == "end_stream"
    s3 = await RunSession.open(client, extra={"x-workbench-scenario": "run_http_error"})
    await s3.send(run_request("no marker"))
    await s3.stream.read_all()
    assert s3.stream.headers[":status"] == "503"
    runs = await sim.state.finished_runs(3)
    assert [r.outcome for r in runs] == ["http 503", "turn_ended", "http 503"]
    await client.close()
    default = await sim_factory(scenario="run_http_error")
    c2, s4 = await open_run(default)
    await s4.send(run_request("hi"))
    await s4.stream.read_all()
    assert s4.stream.headers[":status"] == "503"
    await c2.close()


async def test_run_http_error_on_runsse_by_header(sim_factory: Any) -> None:
    sim = await sim_factory()
    client = await H2Client.connect(sim.url, sim.cert_path)
    rid = pb.BidiRequestId(request_id="r-1")
    st = await client.request(RUN + "SSE", {"content-type": "application/connect+proto", "authorization": "Bearer t",
                                            "x-workbench-scenario": "run_http_error"},
                              encode(bytes(rid.SerializeToString())))
    await st.read_all()
    assert st.headers[":status"] == "503"
    await client.close()


async def test_args_in_started_has_no_partial_tool_call(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:args_in_started] hi"))
    frames = await s.until("exec_server_message.shell_args")
    assert "interaction_update.partial_tool_call" not in kinds_of(frames)
    started = next(server_msg(f).interaction_update.tool_call_started for f in frames
                   if f.kind == "interaction_update.tool_call_started")
    assert started.tool_call.shell_tool_call.args.command == "echo args-in-started"
    await client.close()


async def test_long_exec_runs_for_the_configured_seconds(sim_factory: Any) -> None:
    sim = await sim_factory(long_exec_seconds=2)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:long_exec] hi"))
    frames = await s.until("exec_server_message.shell_stream_args")
    command = server_msg(frames[-1]).exec_server_message.shell_stream_args.command
    assert "-lt 2 ]" in command and "sleep 1" in command
    await client.close()


@pytest.mark.parametrize(("steps", "message"), [
    ([{"unknown_exec": 2}], "field number ExecServerMessage does not have"),
    ([{"text": "x"}, {"http_status": 503}], "must be the first step"),
    ([{"http_status": 200}], "non-200 status"),
    ([{"bad_length_prefix": "x", "off_by": 0}], "non-zero number of bytes"),
    ([{"kv_get": "yours"}], "\"own\""),
])
def test_new_steps_are_checked_when_loaded(steps: list[dict[str, Any]], message: str) -> None:
    from workbench.sim.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=message):
        parse_scenario({"steps": steps}, "mine")

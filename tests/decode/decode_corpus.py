"""Valid frames for every transport and direction, built with the real protobuf runtime."""

from __future__ import annotations

import base64
import json
import random
from functools import lru_cache
from typing import Any

from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, FLAG_TRAILER, encode

UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _real_oneof(desc: Any) -> Any:
    for o in desc.oneofs:
        if len(o.fields) == 1 and o.name == "_" + o.fields[0].name:
            continue
        return o
    return None


def _every_member(top_type: str) -> list[bytes]:
    out = []
    desc = pb.message(top_type).DESCRIPTOR
    for top_fd in _real_oneof(desc).fields:
        sub_oneof = _real_oneof(top_fd.message_type)
        members = [None] if sub_oneof is None else list(sub_oneof.fields)
        for fd in members:
            outer = pb.message(top_type)()
            sub = getattr(outer, top_fd.name)
            sub.SetInParent()
            if "id" in sub.DESCRIPTOR.fields_by_name:
                sub.id = 11
            if fd is not None:
                if fd.message_type is not None:
                    getattr(sub, fd.name).SetInParent()
                else:
                    setattr(sub, fd.name, b"\x0a\x01z")
            out.append(outer.SerializeToString())
    return out


def _server_rich() -> list[bytes]:
    S, U = pb.AgentServerMessage, pb.InteractionUpdate
    blob = json.dumps({"role": "user", "content": "hello wörld " * 40}).encode()
    return [m.SerializeToString() for m in (
        S(interaction_update=U(text_delta=pb.TextDelta(text="Hello"))),
        S(interaction_update=U(text_delta=pb.TextDelta(text="ünïcode → " * 30))),
        S(interaction_update=U(thinking_delta=pb.ThinkingDelta(text="hmm", thinking_style=2))),
        S(interaction_update=U(token_delta=pb.TokenDelta(tokens=17))),
        S(interaction_update=U(partial_tool_call=pb.PartialToolCall(call_id="c1\n", args_text_delta='{"a": 1'))),
        S(interaction_update=U(tool_call_started=pb.ToolCallStarted(call_id="c1", tool_call=pb.ToolCall(
            read_tool_call=pb.ReadToolCall(args=pb.ReadToolArgs(path="/w/x")))))),
        S(interaction_update=U(step_started=pb.StepStarted(step_id=2**40))),
        S(exec_server_message=pb.ExecServerMessage(id=5, exec_id="e5", shell_args=pb.ShellArgs(command="ls"))),
        S(exec_server_message=pb.ExecServerMessage(id=6, mcp_args=pb.McpArgs(
            name="a___b", args={"q": pb.Value(string_value="x").SerializeToString()}))),
        S(kv_server_message=pb.KvServerMessage(id=1, set_blob_args=pb.SetBlobArgs(blob_id=b"\x3f" * 32,
                                                                                   blob_data=blob))),
        S(kv_server_message=pb.KvServerMessage(id=2, get_blob_args=pb.GetBlobArgs(blob_id=b"\x01" * 32))),
        S(conversation_checkpoint_update=pb.ConversationStateStructure(turns=[b"\x02" * 32])),
    )]


def _client_rich() -> list[bytes]:
    C = pb.AgentClientMessage
    return [m.SerializeToString() for m in (
        C(run_request=pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure(),
                                         action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                                             user_message=pb.UserMessage(text="hi"))))),
        C(client_heartbeat=pb.ClientHeartbeat()),
        C(kv_client_message=pb.KvClientMessage(id=1, set_blob_result=pb.SetBlobResult())),
        C(kv_client_message=pb.KvClientMessage(id=2, get_blob_result=pb.GetBlobResult(blob_data=b"{}"))),
        C(exec_client_message=pb.ExecClientMessage(id=5, exec_id="e5", shell_result=pb.ShellResult(
            success=pb.ShellSuccess(exit_code=0, stdout="ok")))),
        C(exec_client_control_message=pb.ExecClientControlMessage(stream_close=pb.ExecClientStreamClose(id=5))),
    )]


END_OK = encode(b"{}", FLAG_END_STREAM)
END_ERR = encode(json.dumps({"error": {"code": "resource_exhausted", "message": "Error", "details": [
    {"type": "aiserver.v1.ErrorDetails",
     "value": base64.b64encode(pb.ErrorDetails(error=51).SerializeToString()).decode().rstrip("=")}]}}).encode(),
    FLAG_END_STREAM)
TRAILER = encode(b"grpc-status: 8\r\ngrpc-message: limit\r\n", FLAG_TRAILER)


@lru_cache(maxsize=1)
def server_payloads() -> tuple[bytes, ...]:
    return tuple(_every_member("AgentServerMessage") + _server_rich())


@lru_cache(maxsize=1)
def client_payloads() -> tuple[bytes, ...]:
    return tuple(_every_member("AgentClientMessage") + _client_rich())


def append_body(inner: bytes, seqno: int = 0, raw_field: bool = False) -> bytes:
    req = pb.BidiAppendRequest(request_id=pb.BidiRequestId(request_id=UUID), append_seqno=seqno)
    if raw_field:
        req.data_bytes = inner
    else:
        req.data = inner.hex()
    return req.SerializeToString()


def poll_body(inner: bytes, seqno: int = 0, eof: bool = False) -> bytes:
    resp = pb.BidiPollResponse(seqno=seqno, data=base64.b64encode(inner).decode())
    if eof:
        resp.eof = True
    return resp.SerializeToString()


@lru_cache(maxsize=1)
def bodies() -> dict[tuple[str, str], tuple[bytes, ...]]:
    """(transport, direction) → complete bodies exactly as that transport carries them."""
    srv, cli = server_payloads(), client_payloads()
    stream_srv = tuple(encode(p) for p in srv) + (END_OK, END_ERR, encode(srv[0], compress=True))
    out: dict[tuple[str, str], tuple[bytes, ...]] = {
        ("run", "server"): stream_srv + (b"".join(encode(p) for p in srv[:20]) + END_OK,),
        ("run", "client"): tuple(encode(p) for p in cli),
        ("runsse", "server"): stream_srv,
        ("runsse", "client"): (encode(pb.BidiRequestId(request_id=UUID).SerializeToString()),),
        ("runpoll", "client"): (encode(pb.BidiPollRequest(request_id=pb.BidiRequestId(request_id=UUID),
                                                          start_request=True).SerializeToString()),),
        ("runpoll", "server"): tuple(encode(poll_body(p, i)) for i, p in enumerate(srv[:40]))
        + (encode(poll_body(b"", 99, eof=True)), END_OK),
        ("bidi_append", "client"): tuple(append_body(p, i, raw_field=i % 5 == 4) for i, p in enumerate(cli)),
        ("bidi_append", "server"): (b"", encode(b"")),
        ("unary", "client"): (b"\x0a\x03foo", encode(b"\x0a\x03foo"), b""),
        ("unary", "server"): (pb.GetServerConfigResponse(http2_config=3).SerializeToString(), TRAILER, END_ERR),
    }
    return out


ALL_KEYS = sorted(bodies())


# ---- fuzz inputs (tests/decode/test_fuzz.py, benchmarks/decode_fuzz.py) ---------------------

MAX_INPUT = 64 * 1024
BIG = encode(pb.AgentServerMessage(kv_server_message={
    "id": 1, "set_blob_args": {"blob_id": b"\x01" * 32,
                               "blob_data": json.dumps({"role": "system", "content": "ab" * 32_000}).encode()}}
).SerializeToString())


def mutate(seed: int, base: bytes) -> bytes:
    """1–4 random edits of a valid body: bit flips, byte stores, inserts, deletes, truncation,
    overwritten length headers, duplicated slices. A drawn seed drives them, which keeps
    Hypothesis' per-example cost low enough for 10,000 examples (the seed reproduces a failure)."""
    rng = random.Random(seed)
    buf = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["flip", "insert", "delete", "truncate", "len", "dup", "byte"])
        pos = rng.randint(0, max(0, len(buf)))
        if op == "flip" and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randint(0, 7)
        elif op == "byte" and buf:
            buf[min(pos, len(buf) - 1)] = rng.randint(0, 255)
        elif op == "insert":
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == "delete":
            del buf[pos : pos + rng.randint(1, 8)]
        elif op == "truncate":
            del buf[pos:]
        elif op == "len":
            value = rng.choice([0, 1, 5, 127, 128, 300, 2**31 - 1, 2**32 - 1])
            buf[pos : pos + 4] = value.to_bytes(4, "big")
        elif op == "dup" and buf:
            end = rng.randint(pos, len(buf))
            buf[end:end] = buf[pos:end]
    return bytes(buf[:MAX_INPUT])


def random_input(seed: int, small: bytes = b"") -> tuple[bytes, list[int]]:
    """``small`` as is, or for every third seed up to 64 KB of random bytes, half of them behind a
    plausible envelope header; and chunk cuts for the streaming decoder."""
    rng = random.Random(seed)
    raw = small
    if seed % 3 == 0:
        n = rng.randint(0, MAX_INPUT)
        raw = rng.randbytes(n)
        if seed % 2 and n >= 5:
            raw = encode(raw[: n - 5])
    cuts = [rng.randrange(MAX_INPUT) for _ in range(rng.randint(0, 6))]
    return raw, cuts


def mutated_input(seed: int, key: tuple[str, str]) -> tuple[bytes, list[int]]:
    """1–4 valid bodies of ``key`` joined and then mutated (``mutate``); and chunk cuts."""
    rng = random.Random(seed)
    pool = bodies()[key]
    if key == ("run", "server"):
        pool = (*pool, BIG)
    body = mutate(seed, b"".join(rng.choices(pool, k=rng.randint(1, 4))))
    cuts = [rng.randrange(MAX_INPUT) for _ in range(rng.randint(0, 6))]
    return body, cuts

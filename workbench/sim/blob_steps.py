"""KV blobs of a simulated run: ``set_blob``/``get_blob`` round trips and the steps built on them.

``kv_set`` stores a prompt message (system, user, assistant text or tool call, tool result) as
the JSON the real server writes; ``kv_get`` asks the client for blobs its conversation state
names (or for one nobody set); ``checkpoint`` stores the turn's steps and sends the
``conversation_checkpoint_update`` that references them. Blob ids are SHA-256 of the data; every
blob set or received is kept with its conversation (``SimState.blobs_of``): the client's blob
store is per conversation, so a blob set in one conversation is not there for another.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.schema import pb
from workbench.sim.run_context import RunContext, Step

MAX_TOKENS = 200_000


def blob_id_of(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _kv_answer(m: Any, kid: int) -> bool:
    return m.WhichOneof("message") == "kv_client_message" and m.kv_client_message.id == kid


async def set_blob(run: RunContext, data: bytes) -> bytes:
    """Send set_blob_args and wait for its result; the blob id."""
    blob_id = blob_id_of(data)
    run.kv_seq += 1
    kid = run.kv_seq
    await run.link.send(pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
        id=kid, set_blob_args=pb.SetBlobArgs(blob_id=blob_id, blob_data=data))), "set_blob_args")
    run.backend.state.blobs_of(run.request.conversation_id)[blob_id.hex()] = data
    run.last_blob_id = blob_id
    m = await run.link.wait(lambda m: _kv_answer(m, kid), f"kv {kid} set_blob_result")
    res = m.kv_client_message
    if res.WhichOneof("result") != "set_blob_result":
        run.rec.faults.append(f"kv {kid}: set_blob answered with {res.WhichOneof('result')}")
    elif res.set_blob_result.HasField("error"):
        run.rec.faults.append(f"kv {kid}: set_blob error {res.set_blob_result.error.message!r}")
    return blob_id


async def get_blob(run: RunContext, blob_id: bytes, label: str) -> bytes | None:
    """Ask the client for a blob; its data, or None (a miss, recorded under ``label``)."""
    run.kv_seq += 1
    kid = run.kv_seq
    await run.link.send(pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
        id=kid, get_blob_args=pb.GetBlobArgs(blob_id=blob_id))), "get_blob_args")
    m = await run.link.wait(lambda m: _kv_answer(m, kid), f"kv {kid} get_blob_result")
    res = m.kv_client_message
    if res.WhichOneof("result") != "get_blob_result" or not res.get_blob_result.HasField("blob_data"):
        run.rec.blob_misses.append(f"{label} {blob_id.hex()[:16]}")
        return None
    data = bytes(res.get_blob_result.blob_data)
    if blob_id_of(data) != blob_id:
        run.rec.faults.append(f"kv {kid}: blob {blob_id.hex()[:16]} came back with different data")
    run.backend.state.blobs_of(run.request.conversation_id).setdefault(blob_id.hex(), data)
    return data


def blob_json(run: RunContext, kind: str, text: str | None) -> Any:
    """The prompt message a ``kv_set`` stores, in the real server's JSON shape."""
    if kind == "system":
        return {"role": "system", "content": system_prompt(run.model)}
    if kind == "user":
        body = text if text is not None else run.user_text
        return {"role": "user", "content": [{"type": "text", "text": f"<user_query>\n{body}\n</user_query>"}],
                "providerOptions": {"cursor": {"requestId": run.conn.request_id or ""}}}
    if kind == "assistant_text":
        return {"id": str(uuid.uuid4()), "role": "assistant",
                "content": [{"type": "text", "text": run.fmt(text) if text else run.text_out}]}
    tool = run.last_tool or {"name": "Shell", "call_id": "call_none", "args": {}}
    if kind == "assistant_tool_call":
        return {"id": str(uuid.uuid4()), "role": "assistant",
                "content": [{"type": "tool-call", "toolCallId": tool["call_id"], "toolName": tool["name"],
                             "args": tool["args"]}]}
    return {"role": "tool", "id": str(uuid.uuid4()),
            "content": [{"type": "tool-result", "toolName": tool["name"], "toolCallId": tool["call_id"],
                         "result": tool.get("result", ""), "experimental_content": None}]}


def system_prompt(model: str) -> str:
    rules = "\n".join(f"{i}. Follow the workbench simulator's rule number {i}: be concise, cite files, "
                      f"prefer small diffs, and explain each tool call." for i in range(1, 41))
    return (f"You are an AI coding assistant, powered by {model}. You operate in the workbench simulator, "
            "a stand-in for Cursor's agent backend used to reproduce client bugs.\n\n"
            f"<rules>\n{rules}\n</rules>\n")


async def kv_set(run: RunContext, kind: str, step: JsonObject) -> None:
    blob_id = await set_blob(run, _json_bytes(blob_json(run, kind, step.get("text"))))
    if kind == "system":
        run.system_id = blob_id
    elif kind == "user":
        run.user_id = blob_id


async def kv_get(run: RunContext, which: str, step: JsonObject) -> None:
    if which == "missing":
        if await get_blob(run, os.urandom(32), "unknown id") is not None:
            run.rec.faults.append("client returned data for a blob id nobody set")
        else:
            run.rec.blob_misses.pop()  # an expected miss
        return
    if which == "own":
        # A blob this very run stored with the client: a client that keeps its blobs has it; one that
        # answers an empty get_blob_result has lost it (pi-cursor #25), recorded as a miss.
        own = run.user_id or run.last_blob_id
        if own is not None:
            await get_blob(run, own, "set by this run")
        return
    state = run.request.conversation_state
    wanted: list[tuple[str, bytes]] = [("turns", bytes(t)) for t in list(state.turns)[-1:]]
    wanted += [("root_prompt_messages_json", bytes(r)) for r in list(state.root_prompt_messages_json)[:1]]
    if not wanted and run.user_id is not None:
        wanted = [("user prompt", run.user_id)]
    for label, blob_id in wanted[: int(step.get("max", 2))]:
        await get_blob(run, blob_id, label)


async def checkpoint(run: RunContext, _value: Any, step: JsonObject, pending: list[str] | None = None) -> None:
    """Store the turn so far as blobs and send the checkpoint (``pending``: pending_tool_calls)."""
    um_id = await set_blob(run, pb.UserMessage(text=run.user_text).SerializeToString())
    step_ids = [await set_blob(run, s) for s in run.turn_steps]
    turn = pb.ConversationTurnStructure(agent_conversation_turn=pb.AgentConversationTurnStructure(
        user_message=um_id, steps=step_ids, request_id=run.conn.request_id or ""))
    turn_id = await set_blob(run, turn.SerializeToString())
    incoming = run.request.conversation_state
    state = pb.ConversationStateStructure()
    roots = list(incoming.root_prompt_messages_json) or ([run.system_id] if run.system_id else [])
    state.root_prompt_messages_json.extend(roots)
    state.turns.extend(list(incoming.turns) + [turn_id])
    state.pending_tool_calls.extend(pending or [])
    used = incoming.token_details.used_tokens + (len(run.user_text) + len(run.text_out)) // 4 + 3000
    state.token_details.used_tokens = min(used, MAX_TOKENS)
    state.token_details.max_tokens = MAX_TOKENS
    await run.link.send(pb.AgentServerMessage(conversation_checkpoint_update=state),
                        "conversation_checkpoint_update")
    if run.request.conversation_id:
        run.backend.state.conversations[run.request.conversation_id] = bytes(state.SerializeToString())


STEPS: dict[str, Step] = {"kv_set": kv_set, "kv_get": kv_get, "checkpoint": checkpoint}

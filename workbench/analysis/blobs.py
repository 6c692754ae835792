"""KV blob analysis: what each set_blob / get_blob carried and what became of it.

One row per KV request (plus ``op='ref'`` rows for ids a checkpoint names but nobody ever set),
in seq order, so a session's rows read as the blob store's lifecycle. Content is sniffed JSON
first (AI-SDK ModelMessage: role + content parts), then the protobuf types the server stores
(accepted only when they parse with no unknown field anywhere and their content is plausible),
then text, then binary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Iterable
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from workbench.analysis.records import SessionFacts
from workbench.analysis.rows import BlobContent, BlobPart, BlobRow
from workbench.decode.tree import message_to_tree
from workbench.nesting import load_json
from workbench.schema import pb

# Overlay types a protobuf blob may be, most specific first.
PROTO_CANDIDATES = ("UserMessage", "ConversationStep", "ConversationTurnStructure", "ConversationStateStructure")
_CLASSES = {name: pb.message(name) for name in PROTO_CANDIDATES}
_TEXT_LIMIT = 2000
_PREVIEW = 120


def blob_rows(facts: SessionFacts, *, final: bool, grace: int, known_ids: Container[bytes] = (),
              cache: dict[bytes, BlobContent] | None = None) -> list[BlobRow]:
    """The ``blobs`` rows of one session (Python values; ``parts`` is a list, ``data`` bytes).
    ``cache`` (SHA-256 of the data → description) may be kept across calls by a live analyzer."""
    refs = checkpoint_refs(facts)
    rows: list[BlobRow] = []
    seen: set[bytes] = set()  # set or served in this session; ``known_ids``: set in another one
    if cache is None:
        cache = {}
    # blob id → (bytes, their SHA-256): a blob set and served every turn is hashed once (comparing
    # the bytes with the ones already hashed costs a fraction of hashing them again)
    digests: dict[bytes, tuple[bytes, bytes]] = {}
    for op in facts.kv:
        answered = op.result_seq is not None
        pending = not answered and (final or op.later_server >= grace)
        if op.op == "set":
            data: bytes | None = op.data
            status = ("set_error" if op.set_error else "stored") if answered else ("unanswered" if pending else "pending")
            seen.add(op.blob_id)
        else:
            if answered:
                if op.result_has_data:
                    data = op.result_data
                    status = "served" if data else "empty"
                    if data:
                        seen.add(op.blob_id)
                else:
                    data = None
                    status = "miss"
            else:
                data = None
                status = "unanswered" if pending else "pending"
        row = _row(facts.session_id, op.blob_id, op.op, op.seq, op.result_seq, op.id, data, status, refs, cache,
                   digests)
        if op.set_error:
            row["preview"] = f"set error: {op.set_error}"
        rows.append(row)
    for blob_id, where in refs.items():
        if blob_id not in seen and blob_id not in known_ids and not where[-1][1].startswith("run_request"):
            seq = where[-1][0]
            rows.append(_row(facts.session_id, blob_id, "ref", seq, None, None, None, "never_set", refs, cache,
                             digests))
    rows.sort(key=lambda r: (r["seq"] if r["seq"] is not None else -1))
    # The bytes are kept once per blob id (the first row that carried them): a system prompt set
    # and served every turn would otherwise be stored dozens of times.
    kept: set[str] = set()
    for r in rows:
        if r["data"] is not None:
            if r["blob_id"] in kept:
                r["data"] = None
            else:
                kept.add(r["blob_id"])
    return rows


def _row(session_id: str, blob_id: bytes, op: str, seq: int, result_seq: int | None, kv_id: int | None,
         data: bytes | None, status: str, refs: dict[bytes, list[tuple[int, str]]],
         cache: dict[bytes, BlobContent], digests: dict[bytes, tuple[bytes, bytes]]) -> BlobRow:
    info: BlobContent
    digest = None
    if data is None:
        info = {"content_type": None, "role": None, "proto_type": None, "parts": None, "preview": None}
    else:
        known = digests.get(blob_id)
        if known is not None and known[0] == data:
            digest = known[1]
        else:
            digest = hashlib.sha256(data).digest()
            digests[blob_id] = (data, digest)
        info = cache.get(digest) or describe(data)
        cache[digest] = info
    where = refs.get(blob_id)
    return {
        "session_id": session_id,
        "blob_id": blob_id.hex(),
        "op": op,
        "seq": seq,
        "result_seq": result_seq,
        "kv_id": kv_id,
        "size": len(data) if data is not None else None,
        "content_type": info["content_type"],
        "role": info["role"],
        "proto_type": info["proto_type"],
        "parts": info["parts"],
        "sha256_ok": (digest == blob_id) if digest is not None else None,
        "checkpoint_ref": where[-1][1] if where else None,
        "status": status,
        "preview": info["preview"],
        "data": data,
    }


# content ---------------------------------------------------------------------------------------

def describe(data: bytes) -> BlobContent:
    """content_type, role, proto_type, parts and a one-line preview of one blob's bytes."""
    out: BlobContent = {"content_type": "binary", "role": None, "proto_type": None, "parts": None,
                           "preview": None}
    if not data:
        out["content_type"] = "empty"
        return out
    head = data[:64].lstrip()
    if head[:1] in (b"{", b"["):
        try:
            doc = load_json(data)
        except ValueError:  # not JSON, or nested past the limit every reader shares
            doc = None
        if doc is not None:
            out["content_type"] = "json"
            if isinstance(doc, dict):
                out["role"] = doc.get("role") if isinstance(doc.get("role"), str) else None
                out["parts"] = json_parts(doc.get("content"))
            out["preview"] = _preview(out["role"], out["parts"], data)
            return out
    fit = proto_fit(data)
    if fit is not None:
        name, msg = fit
        out["content_type"] = "protobuf"
        out["proto_type"] = name
        out["role"], out["parts"] = _proto_parts(name, msg)
        out["preview"] = f"{name}: " + (_preview(None, out["parts"], b"") or _tree_preview(msg))
        return out
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        out["preview"] = data[:24].hex()
        return out
    if all(c.isprintable() or c in "\n\r\t" for c in text[:2048]):
        out["content_type"] = "text"
        out["parts"] = [{"type": "text", "text": _clip(text)}]
        out["preview"] = _one_line(text)
    else:
        out["preview"] = data[:24].hex()
    return out


def json_parts(content: Any) -> list[BlobPart] | None:
    """AI-SDK ModelMessage content → parts: text, tool-call {name,id,args}, tool-result {name,id,result}."""
    if content is None:
        return None
    if isinstance(content, str):
        return [{"type": "text", "text": _clip(content)}]
    if not isinstance(content, list):
        return [{"type": "unknown", "value": _clip(json.dumps(content))}]
    parts: list[BlobPart] = []
    for p in content:
        if not isinstance(p, dict):
            parts.append({"type": "unknown", "value": _clip(json.dumps(p))})
            continue
        kind = p.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _clip(str(p.get("text", "")))})
        elif kind == "tool-call":
            parts.append({"type": "tool-call", "name": p.get("toolName"), "id": p.get("toolCallId"),
                          "args": p.get("args", p.get("input"))})
        elif kind == "tool-result":
            result = p.get("result", p.get("output"))
            parts.append({"type": "tool-result", "name": p.get("toolName"), "id": p.get("toolCallId"),
                          "result": _clip(result if isinstance(result, str) else json.dumps(result))})
        else:
            parts.append({"type": str(kind), "value": _clip(json.dumps(p))})
    return parts


def proto_fit(data: bytes) -> tuple[str, Message] | None:
    """The first candidate type that parses cleanly and looks plausible, with the message."""
    for name in PROTO_CANDIDATES:
        cls = _CLASSES[name]
        try:
            msg = cls.FromString(data)
        except DecodeError:
            continue
        if has_unknown(msg) or not _plausible(name, msg):
            continue
        return name, msg
    return None


def has_unknown(msg: Message) -> bool:
    try:
        if len(UnknownFieldSet(msg)):
            return True
    except Exception:  # pragma: no cover - runtime without the unknown-field API
        return False
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            if fd.message_type.fields_by_name["value"].message_type is not None:
                if any(has_unknown(v) for v in value.values()):
                    return True
            continue
        items = value if fd.is_repeated else [value]
        if any(has_unknown(v) for v in items):
            return True
    return False


def _printable(text: str) -> bool:
    return all(c.isprintable() or c in "\n\r\t" for c in text[:2048])


def _ids_ok(ids: Iterable[bytes]) -> bool:
    return all(len(i) == 32 for i in ids)


def _plausible(name: str, msg: Any) -> bool:
    if name == "UserMessage":
        strings = (msg.text, msg.message_id, msg.rich_text, msg.thread_id, msg.best_of_n_group_id)
        return bool(msg.text or msg.rich_text) and all(_printable(x) for x in strings)
    if name == "ConversationStep" and msg.WhichOneof("message") == "assistant_message":
        return _printable(msg.assistant_message.text)
    if name == "ConversationStep":
        return msg.WhichOneof("message") is not None
    if name == "ConversationTurnStructure":
        case = msg.WhichOneof("turn")
        if case == "agent_conversation_turn":
            t = msg.agent_conversation_turn
            return _ids_ok([t.user_message] if t.user_message else []) and _ids_ok(t.steps)
        return case is not None
    if name == "ConversationStateStructure":
        if not msg.ByteSize():
            return False
        return (_ids_ok(msg.root_prompt_messages_json) and _ids_ok(msg.turns) and _ids_ok(msg.todos)
                and len(msg.summary) in (0, 32) and len(msg.plan) in (0, 32))
    return True


def _proto_parts(name: str, msg: Any) -> tuple[str | None, list[BlobPart] | None]:
    if name == "UserMessage":
        return "user", [{"type": "text", "text": _clip(msg.text or msg.rich_text)}]
    if name == "ConversationStep":
        case = msg.WhichOneof("message")
        if case == "assistant_message":
            return "assistant", [{"type": "text", "text": _clip(msg.assistant_message.text)}]
        if case == "thinking_message":
            return "assistant", [{"type": "thinking", "text": _clip(msg.thinking_message.text)}]
        if case == "tool_call":
            tool = msg.tool_call.WhichOneof("tool")
            tree = message_to_tree(getattr(msg.tool_call, tool)) if tool else {}
            return "assistant", [{"type": "tool-call", "name": _tool_name(tool), "args": tree.get("args"),
                                  "result": tree.get("result")}]
    return None, None


def _tool_name(case: str | None) -> str | None:
    return case[: -len("_tool_call")] if case and case.endswith("_tool_call") else case


# checkpoint references -------------------------------------------------------------------------

_ID_LISTS = ("root_prompt_messages_json", "turns_old", "todos", "turns", "summary_archives")
_ID_SINGLE = ("summary", "plan", "summary_archive")


def state_refs(state: Any, prefix: str = "") -> list[tuple[bytes, str]]:
    """(blob id, field path) for every blob id a ConversationStateStructure names."""
    out: list[tuple[bytes, str]] = []
    for name in _ID_LISTS:
        for i, bid in enumerate(getattr(state, name)):
            out.append((bytes(bid), f"{prefix}{name}[{i}]"))
    for name in _ID_SINGLE:
        bid = getattr(state, name)
        if bid:
            out.append((bytes(bid), f"{prefix}{name}"))
    for key, bid in state.file_states.items():
        if len(bid) == 32:
            out.append((bytes(bid), f"{prefix}file_states[{key}]"))
    return out


def checkpoint_refs(facts: SessionFacts) -> dict[bytes, list[tuple[int, str]]]:
    """blob id → [(seq, field path)] over the session's checkpoints and run-request states,
    following turn structures (user_message, steps) whose bytes the session carried."""
    data_of: dict[bytes, bytes] = {}
    for op in facts.kv:
        if op.op == "set" and op.data:
            data_of[op.blob_id] = op.data
        elif op.result_data:
            data_of[op.blob_id] = op.result_data
    refs: dict[bytes, list[tuple[int, str]]] = {}

    def add(seq: int, items: list[tuple[bytes, str]]) -> None:
        for bid, path in items:
            refs.setdefault(bid, []).append((seq, path))
            data = data_of.get(bid)
            if data is None:
                continue
            if path.split(".")[-1].startswith(("turns[", "turns_old[")):
                try:
                    turn = pb.ConversationTurnStructure.FromString(data)
                except DecodeError:
                    continue
                if turn.WhichOneof("turn") == "agent_conversation_turn":
                    t = turn.agent_conversation_turn
                    sub = [(bytes(t.user_message), f"{path}.user_message")] if t.user_message else []
                    sub += [(bytes(s), f"{path}.steps[{j}]") for j, s in enumerate(t.steps)]
                    for sbid, spath in sub:
                        refs.setdefault(sbid, []).append((seq, spath))

    for rr in facts.run_requests:
        if rr.has_state and not rr.state_empty:
            try:
                state = pb.AgentClientMessage.FromString(rr.payload).run_request.conversation_state
            except DecodeError:
                continue
            add(rr.seq, state_refs(state, "run_request."))
    for seq, _seg, payload in facts.checkpoints:
        try:
            state = pb.AgentServerMessage.FromString(payload).conversation_checkpoint_update
        except DecodeError:
            continue
        add(seq, state_refs(state))
    return refs


# text helpers ----------------------------------------------------------------------------------

def _clip(text: str, limit: int = _TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str, limit: int = _PREVIEW) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _preview(role: str | None, parts: list[BlobPart] | None, data: bytes) -> str:
    bits: list[str] = []
    for p in parts or []:
        if p["type"] == "text":
            bits.append(json.dumps(p["text"][:60]))
        elif p["type"] == "tool-call":
            bits.append(f"tool-call {p.get('name')} {json.dumps(p.get('args'), sort_keys=True)}")
        elif p["type"] == "tool-result":
            bits.append(f"tool-result {p.get('name')} {p.get('result', '')[:40]!r}")
        else:
            bits.append(p["type"])
    if not bits and data:
        bits.append(data[:80].decode("utf-8", "replace"))
    text = ", ".join(bits)
    return _one_line(f"{role}: {text}" if role else text)


def _tree_preview(msg: Message) -> str:
    return _one_line(json.dumps(message_to_tree(msg), default=str))


def summarize_blob(row: BlobRow) -> str:
    """Short label of a blob row for finding messages."""
    kind = row.get("role") or row.get("proto_type") or row.get("content_type") or "?"
    return f"blob {row['blob_id'][:12]}… ({kind}, {row.get('size')} B)"

"""The named field tree of a message, built only when someone looks at a frame.

Known fields are named by the schema; fields the schema does not know are kept under their
number and decoded by blackboxprotobuf's type guessing. ``google.protobuf.Value`` payloads carried
as bytes (McpArgs values, tool input schemas) become plain JSON.
"""

from __future__ import annotations

import base64
from typing import Any

import blackboxprotobuf
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from workbench.decode.lenient import WIRE_NAMES, Mismatch, type_name
from workbench.jsontypes import JsonObject

# (message full name, field name) that hold google.protobuf.Value on the wire, whatever type a schema
# declares for them (public extractions say map<string, bytes> or map<string, Value>; ours bytes).
VALUE_BYTES = {
    ("agent.v1.McpArgs", "args"),
    ("agent.v1.McpToolDefinition", "input_schema"),
    ("agent.v1.McpToolDescriptor", "input_schema"),
}
# The largest payload shown field by field without a schema (blackboxprotobuf guesses every field
# in Python, ~4 s per MiB of small fields; a 64 MiB payload took minutes and gigabytes) or as a hex
# dump. Past it a tree shows the size, a note and the first HEAD_BYTES bytes; the frame's bytes
# themselves are untouched. A length-delimited unknown field is type-guessed up to the same size.
TREE_LIMIT = 256 << 10
_MAX_GUESS = TREE_LIMIT
HEAD_BYTES = 4096
# Unknown fields (or known numbers with another wire type) shown per message; the rest are counted.
MAX_UNKNOWN = 10_000
_TYPE_BYTES = FieldDescriptor.TYPE_BYTES
_TYPE_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_TYPE_ENUM = FieldDescriptor.TYPE_ENUM


def value_bytes_to_json(data: bytes) -> Any:
    """A serialized google.protobuf.Value as JSON; falls back to the UTF-8 text, then hex."""
    try:
        v = struct_pb2.Value.FromString(data)
        if v.WhichOneof("kind") is not None and not len(UnknownFieldSet(v)):
            return json_format.MessageToDict(v)
    except DecodeError:
        pass
    return bytes_to_json(data)


def bytes_to_json(data: bytes) -> Any:
    """Bytes as text when they are UTF-8, else ``{"$hex": …}``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"$hex": data.hex()}
    if any(ord(c) < 0x20 and c not in "\n\r\t" for c in text[:256]):
        return {"$hex": data.hex()}
    return text


def _is_id(name: str) -> bool:
    return name == "blob_id" or name.endswith("_blob_id") or name.endswith("blob_ids")


def _scalar(fd: FieldDescriptor, value: Any, owner: str) -> Any:
    if fd.type == _TYPE_BYTES:
        if _is_id(fd.name) or owner == "agent.v1.ConversationStateStructure":
            return value.hex()
        return bytes_to_json(value)
    if fd.type == _TYPE_ENUM:
        ev = fd.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else value
    return value


def message_to_tree(msg: Message, found: list[JsonObject] | None = None, path: str = "") -> JsonObject:
    """Named dict of set fields plus unknown fields by number (never raises on odd input).

    A field the schema knows that came with another wire type (the runtime files it among the
    unknown fields) is shown schemaless under its name and flagged (``$schema_mismatch``); with
    ``found`` each such field is also listed there with its dotted ``path``.
    """
    out: JsonObject = {}
    owner = msg.DESCRIPTOR.full_name
    for fd, value in msg.ListFields():
        here = f"{path}.{fd.name}" if path else fd.name
        if (owner, fd.name) in VALUE_BYTES:
            out[fd.name] = _as_value(fd, value)
        elif fd.type == _TYPE_MESSAGE:
            mt = fd.message_type
            if mt.GetOptions().map_entry:
                vfd = mt.fields_by_name["value"]
                if vfd.type == _TYPE_MESSAGE:
                    out[fd.name] = {str(k): message_to_tree(v, found, here) for k, v in value.items()}
                else:
                    out[fd.name] = {str(k): _scalar(vfd, v, mt.full_name) for k, v in value.items()}
            elif mt.full_name in _WELL_KNOWN:
                out[fd.name] = (
                    [json_format.MessageToDict(v) for v in value]
                    if fd.is_repeated
                    else json_format.MessageToDict(value)
                )
            elif fd.is_repeated:
                out[fd.name] = [message_to_tree(v, found, here) for v in value]
            else:
                out[fd.name] = message_to_tree(value, found, here)
        elif fd.is_repeated:
            out[fd.name] = [_scalar(fd, v, owner) for v in value]
        else:
            out[fd.name] = _scalar(fd, value, owner)
    if _has_unknown(msg):
        _add_unknown(msg, out, found, path)
    return out


def _as_value(fd: FieldDescriptor, value: Any) -> Any:
    """A field known to carry google.protobuf.Value (see VALUE_BYTES) as JSON, from its wire bytes."""
    mt = fd.message_type
    if mt is not None and mt.GetOptions().map_entry:
        vfd = mt.fields_by_name["value"]
        return {str(k): _one_value(vfd, v) for k, v in value.items()}
    if fd.is_repeated:
        return [_one_value(fd, v) for v in value]
    return _one_value(fd, value)


def _one_value(fd: FieldDescriptor, v: Any) -> Any:
    if isinstance(v, Message):
        return value_bytes_to_json(v.SerializeToString())
    if isinstance(v, str):
        return value_bytes_to_json(v.encode("utf-8"))
    if isinstance(v, bytes):
        return value_bytes_to_json(v)
    return v


_WELL_KNOWN = {"google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue"}


def _has_unknown(msg: Message) -> bool:
    try:
        return len(UnknownFieldSet(msg)) > 0
    except Exception:  # pragma: no cover - runtime without the unknown-field API
        return False


def _add_unknown(msg: Message, out: JsonObject, found: list[JsonObject] | None, path: str) -> None:
    """Unknown fields by number; known numbers with an unexpected wire type as schema mismatches."""
    by_number = msg.DESCRIPTOR.fields_by_number
    unknown = UnknownFieldSet(msg)
    if len(unknown) > MAX_UNKNOWN:  # each is guessed in Python: a hostile message holds millions
        out["$unknown_omitted"] = len(unknown) - MAX_UNKNOWN
    for i, f in enumerate(unknown):
        if i == MAX_UNKNOWN:
            break
        if f.wire_type == 2:
            val = guess_bytes(f.data)
        elif f.wire_type == 3:  # group: keep its nested unknown fields
            val = {str(g.field_number): g.data for g in f.data} if hasattr(f.data, "__iter__") else None
        else:
            val = f.data
        fd = by_number.get(f.field_number)
        if fd is not None:
            m = Mismatch(f"{path}.{fd.name}" if path else fd.name, f.field_number, type_name(fd),
                         WIRE_NAMES.get(f.wire_type, str(f.wire_type)), f.wire_type, 0, (), fd.is_repeated)
            place(out, fd.name, m, val)
            if found is not None:
                found.append(m.as_dict())
            continue
        key = str(f.field_number)
        if key in out:
            prev = out[key]
            if isinstance(prev, list):
                prev.append(val)  # in place: a copy per repeat made a payload of many repeats quadratic
            else:
                out[key] = [prev, val]
        else:
            out[key] = val


def guess_bytes(data: bytes) -> Any:
    """Type-guess a length-delimited value the schema does not know: message, text or bytes."""
    if data and len(data) <= _MAX_GUESS:
        try:
            decoded, _typedef = blackboxprotobuf.decode_message(data)
        except Exception:
            decoded = None
        if isinstance(decoded, dict) and decoded and not _looks_like_text(data):
            return _jsonable(decoded)
    return bytes_to_json(data)


def _looks_like_text(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in text[:512])


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes_to_json(bytes(value))
    return value


def cut_tree(data: bytes, what: str) -> JsonObject:
    """What a tree shows of a payload past ``TREE_LIMIT``: its size and first bytes, with a note."""
    return {"$cut": f"{what} of {len(data)} bytes not shown: over the {TREE_LIMIT >> 10} KiB tree limit; "
                    f"the first {HEAD_BYTES} bytes are in $head_hex",
            "$size": len(data), "$head_hex": data[:HEAD_BYTES].hex()}


def hex_tree(data: bytes) -> JsonObject:
    """``{"$hex": …}`` of a payload, cut past ``TREE_LIMIT``."""
    return {"$hex": data.hex()} if len(data) <= TREE_LIMIT else cut_tree(data, "hex dump")


def decode_unknown(data: bytes) -> JsonObject:
    """Schemaless decode of a whole message: blackboxprotobuf, numbers as keys (cut past ``TREE_LIMIT``)."""
    if not data:
        return {}
    if len(data) > TREE_LIMIT:
        return cut_tree(data, "schemaless tree")
    try:
        decoded, _ = blackboxprotobuf.decode_message(data)
    except Exception as exc:
        return {"$error": f"not protobuf: {exc}", "$base64": base64.b64encode(data).decode()}
    return _jsonable(decoded)  # type: ignore[no-any-return]


# Mismatched fields in a named tree (the parse side, ``repair``, lives in ``lenient``) -----------------

def schemaless(m: Mismatch) -> Any:
    """The mismatched field's value decoded without the schema (blackboxprotobuf for bytes)."""
    if isinstance(m.value, bytes):
        return guess_bytes(m.value)
    return m.value


def _marker(m: Mismatch, value: Any) -> JsonObject:
    return {"$schema_mismatch": f"schema has {m.expected}, frame has {m.found}", "$schemaless": value}


def place(node: JsonObject, name: str, m: Mismatch, value: Any, index: int | None = None) -> None:
    """Show a mismatched field at its place in a named tree: under its name, where the repaired
    message left an empty placeholder or nothing; else under its number, as unknown fields are."""
    cur = node.get(name)
    if cur is None and m.repeated:
        node[name] = [_marker(m, value)]
    elif _is_default(cur):
        node[name] = _marker(m, value)
    elif isinstance(cur, list):
        if index is not None and index < len(cur) and cur[index] == {}:
            cur[index] = _marker(m, value)
        else:
            cur.append(_marker(m, value))
    else:
        key = str(m.number)
        prev = node.get(key)
        if prev is None:
            node[key] = _marker(m, value)
        elif isinstance(prev, list):
            prev.append(_marker(m, value))  # in place: a copy per repeat is quadratic in the repeats
        else:
            node[key] = [prev, _marker(m, value)]


def _is_default(value: Any) -> bool:
    """Absent, or the placeholder ``repair`` put there (an empty message, string or zero)."""
    return value is None or (not isinstance(value, list) and value in ({}, "", 0))


def place_all(tree: JsonObject, found: list[Mismatch]) -> None:
    """Put each mismatch ``repair`` recorded into the tree of the repaired message (schemaless).

    A path the tree cannot be walked along (inside a map entry) goes to ``$schema_mismatch`` at the top.
    """
    for m in found:
        node: Any = tree
        for name, index in m.steps[:-1]:
            nxt = node.get(name) if isinstance(node, dict) else None
            if isinstance(nxt, list):
                nxt = nxt[index] if index < len(nxt) else None
            node = nxt
            if not isinstance(node, dict) or "$schema_mismatch" in node:
                break
        if isinstance(node, dict) and m.steps and "$schema_mismatch" not in node:
            name, index = m.steps[-1]
            place(node, name, m, schemaless(m), index)
        else:
            tree.setdefault("$schema_mismatch", []).append({**m.as_dict(), "$schemaless": schemaless(m)})

"""Named trees of frames, built on demand (``workbench decode --json``, ``frames --json``, the TUI)."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from workbench.decode.classify import (
    COMPRESSED,
    SCHEMA_MISMATCH,
    TRAILING_BYTES,
    Decoder,
    Frame,
)
from workbench.decode.lenient import MAX_FOUND
from workbench.decode.tree import TREE_LIMIT, cut_tree, decode_unknown, hex_tree, message_to_tree, place_all
from workbench.jsontypes import JsonObject
from workbench.nesting import load_json
from workbench.protocol.kinds import is_end_stream, is_openai
from workbench.wire.endstream import parse_end_stream, parse_grpc_web_trailer
from workbench.wire.envelope import FLAG_COMPRESSED

__all__ = ["fields_of", "frame_to_json"]


def fields_of(decoder: Decoder, kind: str, payload: bytes, msg_type: str | None, flags: int = 0,
              found: list[JsonObject] | None = None) -> Any:
    """The named tree of one stored or freshly classified frame.

    A frame kept compressed over an inflate budget (kind ``compressed``) is inflated now, up to
    ``LOOK_LIMIT``: ``$inflated`` tells what it turned out to be. A field whose bytes do not fit the
    schema's type is shown schemaless at its place (``$schema_mismatch``, ``$schemaless``) and, with
    ``found``, listed there ({path, field, expected, found}).
    """
    if kind == COMPRESSED and flags & FLAG_COMPRESSED:
        try:
            inner = decoder.inflate_compressed(payload, msg_type)
        except ValueError as exc:
            return {"$error": f"cannot inflate: {exc}", "$compressed_size": len(payload)}
        tree = fields_of(decoder, inner.kind, inner.payload, inner.msg_type, 0, found)
        head = {"$inflated": {"kind": inner.kind, "summary": inner.summary, "size": len(inner.payload)}}
        return {**head, **tree} if isinstance(tree, dict) else {**head, "$value": tree}
    if is_end_stream(kind):
        if flags & 0x80:
            return parse_grpc_web_trailer(payload)
        try:
            return parse_end_stream(payload, decoder.error_details).as_dict()
        except ValueError:
            return {"$text": payload.decode("utf-8", "replace")}
    if kind == "malformed" and not msg_type:
        return hex_tree(payload)
    if not payload:
        return {}
    if msg_type and decoder.schema.has(msg_type):
        ti = decoder.info(msg_type)
        try:
            return message_to_tree(ti.cls.FromString(payload), found)
        except DecodeError:
            # a unary message's own fields may disagree (its type comes from the RPC path); an agent
            # message whose oneof member does not parse is malformed (``Decoder.parse_lenient``).
            # The lenient parser walks fields in Python: past the tree limit it is not tried.
            msg, bad = decoder.parse_lenient(ti, payload, top_level=kind == "unary") \
                if len(payload) <= TREE_LIMIT else (None, None)
            if msg is not None and bad is not None:
                tree = message_to_tree(msg, found)
                place_all(tree, bad)
                if bad.omitted:
                    tree["$schema_mismatch_omitted"] = bad.omitted
                if found is not None:
                    found.extend(m.as_dict() for m in bad)
                return tree
    if kind == "malformed":
        return hex_tree(payload)
    if is_openai(kind):  # the OpenAI side of a bridge: the JSON (or SSE line) as it crossed the wire
        if len(payload) > TREE_LIMIT:
            return cut_tree(payload, "JSON")
        try:
            return load_json(payload)
        except ValueError as exc:  # not JSON, or nested past the limit: the text, with why
            return {"$error": str(exc)[:300], "$text": payload.decode("utf-8", "replace")}
    if not msg_type and payload[:1] in (b"{", b"["):
        # stream-json (cli_ndjson) frames carry the JSON line itself
        if len(payload) > TREE_LIMIT:
            return cut_tree(payload, "JSON")
        try:
            return load_json(payload)
        except ValueError:  # not JSON, or nested past the limit every reader shares (workbench.nesting)
            pass
    return decode_unknown(payload)


def frame_to_json(decoder: Decoder, f: Frame) -> JsonObject:
    found: list[JsonObject] = []
    out: JsonObject = {"kind": f.kind, "summary": f.summary,
                           "fields": fields_of(decoder, f.kind, f.payload, f.msg_type, f.flags, found),
                           "flags": f.flags, "size": len(f.payload)}
    if f.msg_type:
        out["msg_type"] = f.msg_type
    # ``flags`` is the envelope's flags byte (as stored in ``frames.flags``); decoding flags have
    # their own keys. The classifier's list (it also covers wrappers) wins over the tree's.
    mismatch = (f.meta or {}).get(SCHEMA_MISMATCH) or found
    if mismatch:
        out[SCHEMA_MISMATCH] = mismatch[:MAX_FOUND]  # as many as the classifier keeps; the rest counted
        omitted = (f.meta or {}).get(SCHEMA_MISMATCH + "_omitted", 0) + max(0, len(mismatch) - MAX_FOUND)
        if omitted:
            out[SCHEMA_MISMATCH + "_omitted"] = omitted
    if f.meta and TRAILING_BYTES in f.meta:
        out[TRAILING_BYTES] = f.meta[TRAILING_BYTES]
    for key in ("error", "ref_id", "call_id", "append_seqno", "request_id"):
        val = getattr(f, key)
        if val is not None:
            out[key] = val
    if f.raw is not None and f.raw != f.payload:
        out["raw_hex"] = f.raw.hex()
    return out




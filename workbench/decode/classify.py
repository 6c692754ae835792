"""Frame classification: bytes of one transport/direction → kind, summary and correlation ids.

This is the capture hot path. It parses with the generated protobuf classes (upb), reads the
oneof cases, and formats a one-line summary; it never builds the named field tree (see
``tree.py``, built only when somebody looks at a frame).

The ``Frame`` record and the transport constants live in ``frame.py``, the byte-level fast paths
for the most frequent server frames in ``fastpath.py``; both are re-exported or mixed in here, so
``workbench.decode.classify`` stays the one place to import them from.
"""

from __future__ import annotations

import binascii
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from workbench.decode import summary
from workbench.decode.fastpath import FastPaths
from workbench.decode.frame import BIDI_APPEND as BIDI_APPEND
from workbench.decode.frame import BIDI_POLL_REQ as BIDI_POLL_REQ
from workbench.decode.frame import BIDI_POLL_RESP as BIDI_POLL_RESP
from workbench.decode.frame import BIDI_REQUEST_ID as BIDI_REQUEST_ID
from workbench.decode.frame import CARRIED as CARRIED
from workbench.decode.frame import CLIENT_MSG as CLIENT_MSG
from workbench.decode.frame import COMPRESSED as COMPRESSED
from workbench.decode.frame import DIRECTIONS as DIRECTIONS
from workbench.decode.frame import ENVELOPED as ENVELOPED
from workbench.decode.frame import ERROR_DETAILS as ERROR_DETAILS
from workbench.decode.frame import SCHEMA_MISMATCH as SCHEMA_MISMATCH
from workbench.decode.frame import SERVER_MSG as SERVER_MSG
from workbench.decode.frame import TRAILING_BYTES as TRAILING_BYTES
from workbench.decode.frame import TRANSPORTS as TRANSPORTS
from workbench.decode.frame import WIRE_LENGTH as WIRE_LENGTH
from workbench.decode.frame import Frame as Frame
from workbench.decode.frame import http_error_frame as http_error_frame
from workbench.decode.frame import new_frame
from workbench.decode.lenient import Found, Mismatch, WireError, known_unknowns, repair
from workbench.decode.openai import OpenAIStream, decode_openai_body
from workbench.protocol.kinds import END_STREAM, END_STREAM_ERROR, MALFORMED
from workbench.protocol.routes import OPENAI_TRANSPORTS
from workbench.schema.loader import Schema, load_schema
from workbench.wire.endstream import b64decode_loose, parse_end_stream, parse_grpc_web_trailer
from workbench.wire.envelope import (
    FLAG_COMPRESSED,
    HEADER_LEN,
    LOOK_LIMIT,
    Envelope,
    EnvelopeParser,
    gzip_tail,
    inflate,
    split_frames,
    split_unary,
)
from workbench.wire.inflate import current_budget


def _real_oneof(desc: Any) -> str | None:
    for oneof in desc.oneofs:
        fields = oneof.fields
        if len(fields) == 1 and oneof.name == "_" + fields[0].name:
            continue  # synthetic oneof of a proto3 `optional` field
        return str(oneof.name)
    return None


class _TypeInfo:
    """Per-message-type tables computed once from descriptors."""

    __slots__ = ("cls", "oneof", "member_oneof", "number_of")

    def __init__(self, schema: Schema, full_name: str) -> None:
        desc = schema.descriptor(full_name)
        self.cls = schema.message_class(full_name)
        self.oneof = _real_oneof(desc)
        # member name → the real oneof name of its message type (None when it has none)
        self.member_oneof: dict[str, str | None] = {}
        self.number_of: dict[str, int] = {}
        for f in desc.fields:
            self.number_of[f.name] = f.number
            if f.message_type is not None:
                self.member_oneof[f.name] = _real_oneof(f.message_type)


def _unknown_numbers(msg: Message) -> list[int]:
    try:
        return [f.field_number for f in UnknownFieldSet(msg)]
    except Exception:  # pragma: no cover - unknown-field API differences between runtimes
        return []


def append_payload(req: Any) -> bytes:
    """The AgentClientMessage bytes a BidiAppendRequest carries: raw field 4, else hex field 1.

    Raises ValueError when field 1 is not hex.
    """
    if req.data_bytes:
        return bytes(req.data_bytes)
    return binascii.unhexlify(req.data)


class Decoder:
    """Classifies frames with a schema (the overlay plus any user protos)."""

    def __init__(self, schema: Schema | None = None, *, fast: bool = True) -> None:
        self.schema = schema or load_schema()
        self._info: dict[str, _TypeInfo] = {}
        self._server = self.info(SERVER_MSG)
        self._client = self.info(CLIENT_MSG)
        # Hot-path tables (see ``classify_agent``). The byte-level fast paths assume the overlay's
        # layout (``FastPaths.for_schema`` says whether this schema has it).
        self._fast = fast
        self.fast_paths = FastPaths.for_schema(self.schema) if fast else None
        self._small: dict[str, dict[bytes, tuple[str, str, str | None, int | None, str | None]]] = {
            SERVER_MSG: {}, CLIENT_MSG: {}}
        self._call_id_members: frozenset[str] = frozenset()
        if "interaction_update" in self._server.number_of:
            upd = self.schema.descriptor(SERVER_MSG).fields_by_name["interaction_update"].message_type
            self._call_id_members = frozenset(
                f.name for f in upd.fields if f.message_type is not None and "call_id" in f.message_type.fields_by_name)

    def info(self, full_name: str) -> _TypeInfo:
        ti = self._info.get(full_name)
        if ti is None:
            ti = self._info[full_name] = _TypeInfo(self.schema, full_name)
        return ti

    # agent messages ------------------------------------------------------------------------

    def classify_agent(self, payload: bytes, msg_type: str) -> Frame:
        """Classify one AgentServerMessage / AgentClientMessage (or any schema type)."""
        if self._fast:
            n = len(payload)
            if n <= _SMALL:
                # Tiny frames (heartbeats, token counts, stream_close …) repeat byte for byte, and
                # classification is a pure function of the bytes: remember the answer.
                cache = self._small.get(msg_type)
                if cache is not None:
                    hit = cache.get(payload)
                    if hit is None:
                        f = self._classify(payload, msg_type)
                        if f.meta is None:  # a flagged frame (schema mismatch) is not worth a slot
                            if len(cache) >= _SMALL_CACHE:
                                cache.clear()
                            cache[bytes(payload)] = (f.kind, f.summary, f.error, f.ref_id, f.call_id)
                        return f
                    return new_frame(hit[0], hit[1], payload, 0, msg_type, hit[2], None, hit[3], hit[4])
            elif msg_type == SERVER_MSG and (fp := self.fast_paths) is not None:
                first = payload[0]
                if first == 0x0A:
                    f2 = fp.update(payload, n)
                    if f2 is not None:
                        return f2
                elif first == 0x22 or first == 0x12:
                    f2 = fp.set_blob(payload, n) if first == 0x22 else fp.exec_server(payload)
                    if f2 is not None:
                        return f2
        return self._classify(payload, msg_type)

    def _classify(self, payload: bytes, msg_type: str, repaired: Message | None = None) -> Frame:
        """The protobuf-runtime classification every fast path must agree with.

        ``repaired`` is the message parsed from ``payload`` with the fields that did not fit the
        schema replaced (``lenient.repair``); the frame keeps the original bytes.
        """
        if not payload:
            return Frame("empty", "empty message", payload, msg_type=msg_type)
        ti = self._server if msg_type == SERVER_MSG else self._client if msg_type == CLIENT_MSG else None
        if ti is None:
            return self.classify_other(payload, msg_type)
        if repaired is None:
            try:
                msg = ti.cls.FromString(payload)
            except DecodeError as exc:
                return self._lenient(payload, msg_type, ti, f"protobuf: {exc}")
        else:
            msg = repaired
        top = msg.WhichOneof(ti.oneof) if ti.oneof else None
        if top is None:
            nums = _unknown_numbers(msg)
            if repaired is None and nums and known_unknowns(nums, msg.DESCRIPTOR):
                return self._lenient(payload, msg_type, ti, None)
            label = str(nums[0]) if nums else "empty"
            return Frame(label, f"unknown member {label}" if nums else "no member set", payload,
                         msg_type=msg_type)
        sub = getattr(msg, top)
        sub_oneof = ti.member_oneof.get(top)
        if sub_oneof is None:
            fn = _PLAIN_SUMMARIES.get(top)
            return new_frame(top, fn(sub) if fn is not None else top, payload, 0, msg_type)
        member = sub.WhichOneof(sub_oneof)
        if member is None:
            unknown = _unknown_numbers(sub)
            if repaired is None and unknown and known_unknowns(unknown, sub.DESCRIPTOR):
                return self._lenient(payload, msg_type, ti, None)
            nums = [n for n in unknown if n not in _ID_FIELDS] or unknown
            return Frame(f"{top}.{nums[0]}" if nums else top,
                         f"{top} unknown member {nums[0]}" if nums else f"{top} (no member)",
                         payload, 0, msg_type, None, None, sub.id if top in _HAS_ID else None)
        kind = _KINDS.get((top, member))
        if kind is None:
            kind = _KINDS[(top, member)] = f"{top}.{member}"
        if top == "interaction_update":
            inner = getattr(sub, member)
            fn = _UPDATE_SUMMARIES.get(member)
            cid = inner.call_id if member in self._call_id_members else None
            return new_frame(kind, fn(inner) if fn is not None else member, payload, 0, msg_type,
                         None, None, None, cid or None)
        tfn = _TOP_SUMMARIES.get(top)
        if top in _HAS_ID:
            ref = sub.id
        elif top in _CONTROL:
            ref = getattr(sub, member).id
        else:
            ref = None
        return new_frame(kind, tfn(sub, member) if tfn is not None else kind, payload, 0, msg_type, None, None, ref)

    def _lenient(self, payload: bytes, msg_type: str, ti: _TypeInfo, error: str | None) -> Frame:
        """An agent message the runtime rejected (``error``) or filed a known field of among the
        unknown ones (``error`` None): decoded as far as the bytes go, or ``malformed``."""
        msg, bad = self.parse_lenient(ti, payload)
        if msg is None:
            if error is None:  # nothing to repair after all: classify what the runtime made of it
                return self._classify(payload, msg_type, ti.cls.FromString(payload))
            return Frame("malformed", f"not a valid {msg_type.rsplit('.', 1)[-1]}", payload,
                         msg_type=msg_type, error=error)
        return flag_mismatches(self._classify(payload, msg_type, msg), bad)

    def parse_lenient(self, ti: _TypeInfo, payload: bytes,
                      top_level: bool = False) -> tuple[Message | None, Found]:
        """``payload`` parsed with the fields that do not fit the schema replaced, and those fields.

        (None, []) when nothing needed replacing or the bytes are broken at the wire level, and,
        unless ``top_level``, when a field of the message itself does not fit: an agent message or
        a wrapper is a oneof or a few ids, so if those do not parse nothing of it did (the IDE's
        ``0a 03 66 6f 6f`` BidiAppend is no run_request, docs/protocol.md §3).
        """
        bad = Found()
        try:
            fixed = repair(payload, ti.cls.DESCRIPTOR, bad)
            if bad and (top_level or all(len(m.steps) > 1 for m in bad)):
                return ti.cls.FromString(fixed), bad
        except (WireError, DecodeError):
            pass
        return None, Found()

    def _parse(self, full_name: str, payload: bytes, top_level: bool = False) -> tuple[Any, list[Mismatch]]:
        """A wrapper or unary message parsed as far as the bytes go; DecodeError when they are broken."""
        ti = self.info(full_name)
        try:
            return ti.cls.FromString(payload), []
        except DecodeError:
            msg, bad = self.parse_lenient(ti, payload, top_level)
            if msg is None:
                raise
            return msg, bad

    def classify_other(self, payload: bytes, msg_type: str | None) -> Frame:
        """A message of a type that has no agent-level classification (unary calls, wrappers)."""
        if not payload:
            return Frame("empty", "empty message", payload, msg_type=msg_type)
        short = msg_type.rsplit(".", 1)[-1] if msg_type else "message"
        bad: list[Mismatch] = []
        if msg_type and self.schema.has(msg_type):
            try:
                _msg, bad = self._parse(msg_type, payload, top_level=True)
            except DecodeError as exc:
                return Frame("malformed", f"not a valid {short}", payload, msg_type=msg_type,
                             error=f"protobuf: {exc}")
        f = Frame("unary", f"{short} {summary.human_size(len(payload))}", payload, msg_type=msg_type)
        return _flagged(f, bad)

    # envelopes and wrappers ------------------------------------------------------------------

    def frames_from_envelope(self, env: Envelope, transport: str, direction: str) -> Frame:
        """One frame from one envelope of a streaming transport (or a unary body)."""
        if env.error is not None and env.flags < 0:
            # A truncated tail is what a body held after its last complete envelope: say so.
            where = "after the last complete envelope" if env.error.startswith("truncated frame") else "unframed"
            return Frame("malformed", f"{summary.human_size(len(env.payload))} {where}", env.payload, flags=0,
                         error=env.error, raw=None)
        if env.is_trailer:
            t = parse_grpc_web_trailer(env.payload)
            status = t.get("grpc-status", "?")
            kind = END_STREAM if status == "0" else END_STREAM_ERROR
            return Frame(kind, f"grpc-web trailer status {status} {t.get('grpc-message', '')}".rstrip(),
                         env.payload, flags=env.flags, error=env.error)
        if env.deferred:
            # Over an inflate budget (workbench.wire.inflate): kept compressed, inflated when viewed.
            return Frame(COMPRESSED, f"gzip frame {summary.human_size(len(env.payload))} kept compressed (over an "
                         "inflate budget)", env.payload, flags=env.flags,
                         msg_type=CARRIED.get((transport, direction)), error=env.error)
        if env.is_end_stream:
            return self._end_stream(env)
        if env.error is not None:  # a gzip failure: keep the compressed bytes
            return Frame("malformed", f"undecodable compressed frame {summary.human_size(len(env.payload))}",
                         env.payload, flags=env.flags, error=env.error)
        f = self.classify_carried(env.payload, CARRIED.get((transport, direction)))
        f.flags = env.flags if env.enveloped else 0
        if env.raw is not None and env.flags & FLAG_COMPRESSED:
            # inflated: the length it had on the wire is a fact of the envelope (``frames.meta``)
            f.meta = {**(f.meta or {}), WIRE_LENGTH: len(env.raw)}
            if env.tail:
                flag_trailing(f, env.tail)
        return f

    def classify_carried(self, payload: bytes, carried: str | None) -> Frame:
        """Classify one de-enveloped message of the type a transport carries (unwrapping wrappers)."""
        if carried == BIDI_APPEND:
            return self.unwrap_append(payload)
        if carried == BIDI_POLL_RESP:
            return self.unwrap_poll(payload)
        if carried == BIDI_REQUEST_ID:
            return self._request_id(payload)
        if carried == BIDI_POLL_REQ:
            return self._poll_request(payload)
        if carried in (SERVER_MSG, CLIENT_MSG):
            return self.classify_agent(payload, carried)
        return self.classify_other(payload, carried)

    def inflate_compressed(self, payload: bytes, msg_type: str | None, limit: int = LOOK_LIMIT) -> Frame:
        """A ``compressed`` frame (kept compressed over a budget), inflated and classified now.

        Raises ValueError when it does not inflate within ``limit``.
        """
        data = inflate(payload, limit)
        f = self.classify_carried(data, msg_type)
        f.flags = FLAG_COMPRESSED
        tail = gzip_tail(payload, data)
        return flag_trailing(f, tail) if tail else f

    def _end_stream(self, env: Envelope) -> Frame:
        try:
            es = parse_end_stream(env.payload, self.error_details)
        except ValueError as exc:
            return Frame("malformed", "bad end-stream", env.payload, flags=env.flags, error=str(exc))
        if not es.is_error:
            return Frame(END_STREAM, "end-stream ok", env.payload, flags=env.flags)
        label = ""
        for d in es.details:
            v = d.get("value") or {}
            dbg = d.get("debug") or {}
            label = str(v.get("error") or dbg.get("error") or "")
            if label:
                break
        msg = summary.quote(es.message or "", 50)
        return Frame(END_STREAM_ERROR, f"{es.code} {msg} {label}".rstrip(), env.payload, flags=env.flags)

    def error_details(self, raw: bytes) -> dict[str, Any]:
        from workbench.decode.tree import message_to_tree  # blackboxprotobuf: only when a tree is built

        msg = self.info(ERROR_DETAILS).cls.FromString(raw)
        tree = message_to_tree(msg)
        names = _ERROR_NAMES
        code = tree.get("error")
        if isinstance(code, int) and code in names:
            tree["error"] = names[code]
        return tree

    def _wrapper(self, msg_type: str, body: bytes) -> tuple[Any, list[Mismatch]] | Frame:
        """A wrapper message (BidiAppend, BidiPoll, BidiRequestId) and the fields of it that did not fit
        the schema, or, when its bytes are broken, the ``malformed`` frame that says which wrapper."""
        try:
            return self._parse(msg_type, body)
        except DecodeError as exc:
            return Frame("malformed", f"not a {msg_type.rsplit('.', 1)[-1]}", body, msg_type=msg_type,
                         error=f"protobuf: {exc}")

    def unwrap_append(self, body: bytes) -> Frame:
        """BidiAppendRequest → the AgentClientMessage inside (hex field 1 or raw field 4)."""
        if isinstance(parsed := self._wrapper(BIDI_APPEND, body), Frame):
            return parsed
        req, bad = parsed
        request_id = req.request_id.request_id if req.HasField("request_id") else None
        seqno = req.append_seqno
        try:
            inner = append_payload(req)
        except ValueError as exc:
            return Frame("malformed", "BidiAppend data is not hex", body, msg_type=BIDI_APPEND,
                         error=f"BidiAppend data is not hex: {exc}", request_id=request_id,
                         append_seqno=seqno)
        f = self.classify_agent(inner, CLIENT_MSG)
        if f.kind == MALFORMED:
            f.error = f"BidiAppend data is not an AgentClientMessage ({f.error})"
        f.raw = body
        f.request_id = request_id
        f.append_seqno = seqno
        return _flagged(f, bad, "BidiAppendRequest")

    def unwrap_poll(self, body: bytes) -> Frame:
        """BidiPollResponse → the AgentServerMessage inside its base64 ``data``."""
        if isinstance(parsed := self._wrapper(BIDI_POLL_RESP, body), Frame):
            return parsed
        resp, bad = parsed
        if not resp.data:
            eof = " eof" if resp.eof else ""
            f = Frame("empty", f"poll #{resp.seqno}{eof} (no data)", b"", raw=body,
                      msg_type=SERVER_MSG, append_seqno=resp.seqno)
            return _flagged(f, bad, "BidiPollResponse")
        try:
            inner = b64decode_loose(resp.data)
        except (binascii.Error, ValueError) as exc:
            return Frame("malformed", "poll data is not base64", body, msg_type=BIDI_POLL_RESP,
                         error=f"poll data: {exc}", append_seqno=resp.seqno)
        f = self.classify_agent(inner, SERVER_MSG)
        f.raw = body
        f.append_seqno = resp.seqno
        if resp.eof:
            f.summary += " (eof)"
        return _flagged(f, bad, "BidiPollResponse")

    def _request_id(self, body: bytes) -> Frame:
        if isinstance(parsed := self._wrapper(BIDI_REQUEST_ID, body), Frame):
            return parsed
        m, bad = parsed
        f = Frame("bidi_request_id", f"request_id {m.request_id}", body, msg_type=BIDI_REQUEST_ID,
                  request_id=m.request_id)
        return _flagged(f, bad)

    def _poll_request(self, body: bytes) -> Frame:
        if isinstance(parsed := self._wrapper(BIDI_POLL_REQ, body), Frame):
            return parsed
        m, bad = parsed
        rid = m.request_id.request_id if m.HasField("request_id") else None
        f = Frame("bidi_poll_request", f"poll request_id {rid}", body, msg_type=BIDI_POLL_REQ,
                  request_id=rid)
        return _flagged(f, bad)

    # whole bodies ------------------------------------------------------------------------------

    def decode_body(self, data: bytes, transport: str, direction: str,
                    msg_type: str | None = None, session: str | None = None) -> list[Frame]:
        """Every frame in a complete body, as that transport carries it.

        ``session`` names the session whose inflate budget gzip frames are charged to
        (``workbench.wire.inflate``; default: this body alone).
        """
        if transport in OPENAI_TRANSPORTS:
            return decode_openai_body(data, direction)
        inflate = current_budget().session(session)
        if (transport, direction) in ENVELOPED:
            envs = split_frames(data, inflate=inflate)
        else:
            envs = split_unary(data, inflate)
        frames = [self.frames_from_envelope(e, transport, direction) for e in envs]
        if transport == "bidi_append" and direction == "client":
            for e, f in zip(envs, frames, strict=True):
                if e.enveloped and e.flags >= 0:
                    # A gRPC-Web append (mode D): keep the envelope as it crossed the wire, so the
                    # recording shows how the body was framed (a 415 is often about exactly that).
                    f.raw = data[e.offset : e.offset + HEADER_LEN + len(e.wire_bytes)]
        if msg_type and transport == "unary":
            for f in frames:
                if f.kind == "unary":
                    f.msg_type = msg_type
        return frames

    def stream(self, transport: str, direction: str, session: str | None = None) -> StreamDecoder:
        if transport in OPENAI_TRANSPORTS:  # the OpenAI side of a bridge: JSON and SSE, no envelopes
            return OpenAIStream(direction)  # type: ignore[return-value]  # same feed/close interface
        return StreamDecoder(self, transport, direction, session)


class StreamDecoder:
    """Incremental: feed the chunks of one streamed body, get frames as they complete.

    ``session`` names the session whose inflate budget gzip frames are charged to (default: this
    stream alone).
    """

    __slots__ = ("_dec", "_parser", "transport", "direction")

    def __init__(self, decoder: Decoder, transport: str, direction: str, session: str | None = None) -> None:
        self._dec = decoder
        self._parser = EnvelopeParser(inflate=current_budget().session(session))
        self.transport = transport
        self.direction = direction

    def unconsumed(self) -> bytes:
        """The bytes fed that no frame has taken yet (``EnvelopeParser.unconsumed``)."""
        return self._parser.unconsumed()

    def feed(self, chunk: bytes) -> list[Frame]:
        dec = self._dec
        carried = CARRIED.get((self.transport, self.direction))
        if carried is SERVER_MSG and (fp := dec.fast_paths) is not None:
            return self._feed_server(chunk, fp)
        if carried is SERVER_MSG or carried is CLIENT_MSG:
            # Plain frames of agent streams go straight to the classifier (no Envelope objects).
            classify = dec.classify_agent
            t, d = self.transport, self.direction
            return [classify(e, carried) if type(e) is bytes else dec.frames_from_envelope(e, t, d)  # type: ignore[arg-type]
                    for e in self._parser.feed_fast(chunk)]
        return [dec.frames_from_envelope(e, self.transport, self.direction) for e in self._parser.feed(chunk)]

    def _feed_server(self, chunk: bytes, fp: FastPaths) -> list[Frame]:
        """``feed`` of a server stream: ``classify_agent``'s dispatch inlined (a call less for each
        frame of the most frequent kinds, a capture's hot loop). Small frames still go through
        ``classify_agent`` (its memo); a frame the fast paths decline takes the protobuf path, as
        it would there."""
        dec = self._dec
        update, set_blob, exec_server, slow = fp.update, fp.set_blob, fp.exec_server, dec._classify
        memo = dec._small[SERVER_MSG]
        out: list[Frame] = []
        append = out.append
        for e in self._parser.feed_fast(chunk):
            if type(e) is bytes:
                n = len(e)
                if n <= _SMALL:
                    hit = memo.get(e)
                    append(dec.classify_agent(e, SERVER_MSG) if hit is None else
                           new_frame(hit[0], hit[1], e, 0, SERVER_MSG, hit[2], None, hit[3], hit[4]))
                    continue
                first = e[0]
                f = (update(e, n) if first == 0x0A else set_blob(e, n) if first == 0x22 else
                     exec_server(e) if first == 0x12 else None)
                append(f if f is not None else slow(e, SERVER_MSG))
            else:
                append(dec.frames_from_envelope(e, self.transport, self.direction))  # type: ignore[arg-type]
        return out

    def close(self) -> list[Frame]:
        return [self._dec.frames_from_envelope(e, self.transport, self.direction) for e in self._parser.close()]


def flag_mismatches(f: Frame, bad: list[Mismatch], wrapper: str | None = None) -> Frame:
    """Flag a frame decoded past fields that did not fit the schema: ``frames.meta.schema_mismatch``
    lists them (path, field number, expected, found), the summary names their paths."""
    items = [m.as_dict() for m in bad]
    if wrapper:
        for item in items:
            item["path"] = f"{wrapper}.{item['path']}"
    meta = {**(f.meta or {}), SCHEMA_MISMATCH: [*(f.meta or {}).get(SCHEMA_MISMATCH, ()), *items]}
    omitted = bad.omitted if isinstance(bad, Found) else 0
    if omitted:
        meta[SCHEMA_MISMATCH + "_omitted"] = omitted
    f.meta = meta
    shown = list(dict.fromkeys(i["path"] for i in items))[:3]
    more = sum(i["path"] not in shown for i in items) + omitted
    f.summary += f" [schema mismatch: {', '.join(shown)}{f' (+{more} more)' if more else ''}]"
    return f


def _flagged(f: Frame, bad: list[Mismatch], wrapper: str | None = None) -> Frame:
    """``f`` flagged with ``bad`` when any field did not fit the schema, else ``f`` as it is."""
    return flag_mismatches(f, bad, wrapper) if bad else f


def flag_trailing(f: Frame, tail: bytes) -> Frame:
    """Note the bytes a gzip frame carried after its gzip data (``frames.meta.trailing_bytes``:
    their count and, up to ``TRAILING_KEPT`` of them, their hex), so they are never dropped unsaid."""
    f.meta = {**(f.meta or {}), TRAILING_BYTES: {"count": len(tail), "hex": tail[:TRAILING_KEPT].hex(),
                                                 "where": "after the gzip data"}}
    f.summary += f" [{summary.human_size(len(tail))} after the gzip data]"
    return f


TRAILING_KEPT = 4096

# Payloads up to this size are memoised per message type (bounded by _SMALL_CACHE entries).
_SMALL = 16
_SMALL_CACHE = 8192

_HAS_ID = frozenset({"exec_server_message", "exec_client_message", "kv_server_message", "kv_client_message",
                     "interaction_query", "interaction_response"})
_CONTROL = frozenset({"exec_client_control_message", "exec_server_control_message"})
# Numbers of fields outside the oneof of the id-carrying messages (id, exec_id, span_context …),
# which must not be mistaken for an unknown oneof member.
_ID_FIELDS = frozenset({1, 4, 15, 19, 39, 45, 55})

_KINDS: dict[tuple[str, str], str] = {}
_PLAIN_SUMMARIES = summary.PLAIN_SUMMARIES
_UPDATE_SUMMARIES = summary.UPDATE_SUMMARIES
_TOP_SUMMARIES = summary.TOP_SUMMARIES

_ERROR_NAMES = {2: "ERROR_NOT_LOGGED_IN", 5: "ERROR_BAD_MODEL_NAME", 13: "ERROR_OPENAI",
                30: "ERROR_OUTDATED_CLIENT", 38: "ERROR_UNAUTHORIZED", 51: "ERROR_RATE_LIMITED_CHANGEABLE"}


_default: Decoder | None = None


def default_decoder() -> Decoder:
    global _default
    if _default is None:
        _default = Decoder()
    return _default

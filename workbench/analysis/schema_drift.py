"""Schema drift in captures (``workbench schema drift``): every field path the schema does not name.

Three things show that Cursor sent something a schema does not know:

* **unknown field**: a field number the message's type lacks (the decoded tree keys it by number;
  at a oneof it is a numbered frame kind such as ``exec_server_message.44``);
* **opaque bytes**: a field the schema types ``bytes`` whose value is not text, so the tree shows
  ``{"$hex": …}`` (ids, which are hex by design, excepted);
* **unknown type**: a frame whose ``msg_type`` the schema has no message for.

Numbered frame kinds are counted exactly with one SQL aggregate. Everything else needs the
payloads: they are read a page at a time per session (``PAGE_ROWS``), or, with ``sample``, at most
that many frames per kind chosen by SQL, so memory stays bounded by a page whatever the database
holds. Each path keeps counts, sessions, first/last seen, client versions and one example value;
with a second schema (``against``), whether that schema names the path and how.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from workbench.decode.tree import VALUE_BYTES, _scalar, guess_bytes
from workbench.schema.diff import field_type
from workbench.schema.loader import Schema
from workbench.store import analysis_reads as reads
from workbench.store.reader import LocalReader, RemoteReader


class NamedBy(TypedDict):
    """How a schema names a drift path: the field (or message) name, its type, its owner message."""

    name: str
    type: str
    owner: NotRequired[str]


class RecordedSchema(TypedDict):
    """A schema sessions were recorded with (``sessions.meta.schema``) and how many used it."""

    hash: str | None
    source: str | None
    messages: int | None
    sessions: int


class PayloadRow(TypedDict):
    """A frame the drift walk parses, with its session's client version."""

    session_id: str
    seq: int
    ts: datetime | None
    msg_type: str
    payload: bytes
    client_version: str | None


PAGE_ROWS = 500
EXAMPLE_CHARS = 160
MAX_VERSIONS = 8
UNKNOWN_FIELD = "unknown field"
OPAQUE = "opaque bytes"
UNKNOWN_TYPE = "unknown type"
_TYPE_BYTES = FieldDescriptor.TYPE_BYTES
_TYPE_MESSAGE = FieldDescriptor.TYPE_MESSAGE


@dataclass
class DriftPath:
    """One field path that decoded as unknown, numbered or opaque bytes."""

    path: str                       # AgentServerMessage.exec_server_message.44
    what: str                       # UNKNOWN_FIELD | OPAQUE | UNKNOWN_TYPE
    root: str                       # the frame's msg_type
    numbers: tuple[int, ...]        # field numbers from the root
    owner: str | None = None        # the message type holding the field
    frames: int = 0
    sessions: set[str] = field(default_factory=set)
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    client_versions: set[str] = field(default_factory=set)
    example: str | None = None
    example_at: tuple[str, int] | None = None
    named: NamedBy | None = None  # how the other schema names it (None: it does not)

    def seen(self, sid: str, seq: int, ts: datetime | None, version: str | None) -> None:
        self.frames += 1
        self.sessions.add(sid)
        if ts is not None:
            self.first_seen = ts if self.first_seen is None else min(self.first_seen, ts)
            self.last_seen = ts if self.last_seen is None else max(self.last_seen, ts)
        if version and len(self.client_versions) < MAX_VERSIONS:
            self.client_versions.add(version)
        if self.example_at is None:
            self.example_at = (sid, seq)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "what": self.what, "msg_type": self.root, "owner": self.owner,
                "numbers": list(self.numbers), "frames": self.frames, "sessions": len(self.sessions),
                "first_seen": _iso(self.first_seen), "last_seen": _iso(self.last_seen),
                "client_versions": sorted(self.client_versions), "example": self.example,
                "example_at": {"session_id": self.example_at[0], "seq": self.example_at[1]} if self.example_at else None,
                "named_by_other": self.named}


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(sep=" ", timespec="milliseconds") if ts is not None else None


@dataclass
class DriftReport:
    paths: list[DriftPath]
    frames_total: int
    frames_walked: int
    sample: int | None
    recorded_with: list[RecordedSchema]


def _example(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS - 1] + "…"


class _Walker:
    """Walks decoded messages and collects drift paths (one instance per report)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.paths: dict[str, DriftPath] = {}
        self._classes: dict[str, type[Message] | None] = {}

    def cls(self, msg_type: str) -> type[Message] | None:
        if msg_type not in self._classes:
            self._classes[msg_type] = self.schema.message_class(msg_type) if self.schema.has(msg_type) else None
        return self._classes[msg_type]

    def _hit(self, key: str, what: str, root: str, numbers: tuple[int, ...], owner: str | None,
             at: tuple[str, int, datetime | None, str | None], example: Any) -> None:
        p = self.paths.get(key)
        if p is None:
            p = self.paths[key] = DriftPath(key, what, root, numbers, owner)
        first = p.example_at is None
        p.seen(*at)
        if first:
            p.example = _example(example() if callable(example) else example)

    def frame(self, sid: str, seq: int, ts: datetime | None, version: str | None, msg_type: str,
              payload: bytes) -> None:
        at = (sid, seq, ts, version)
        cls = self.cls(msg_type)
        if cls is None:
            self._hit(msg_type, UNKNOWN_TYPE, msg_type, (), None, at, lambda: guess_bytes(payload))
            return
        try:
            msg = cls.FromString(payload)
        except DecodeError:
            return  # stored as malformed-for-this-schema: not a schema question
        self._walk(msg, msg_type.rsplit(".", 1)[-1], msg_type, (), at)

    def _walk(self, msg: Message, path: str, root: str, numbers: tuple[int, ...],
              at: tuple[str, int, datetime | None, str | None]) -> None:
        owner = msg.DESCRIPTOR.full_name
        for fd, value in msg.ListFields():
            here, nums = f"{path}.{fd.name}", (*numbers, fd.number)
            if fd.type == _TYPE_MESSAGE:
                mt = fd.message_type
                if mt.GetOptions().map_entry:
                    if mt.fields_by_name["value"].type == _TYPE_MESSAGE:
                        for v in value.values():
                            self._walk(v, here, root, nums, at)
                    continue
                if (owner, fd.name) in VALUE_BYTES:
                    continue
                for v in (value if fd.is_repeated else (value,)):
                    self._walk(v, here, root, nums, at)
            elif fd.type == _TYPE_BYTES and (owner, fd.name) not in VALUE_BYTES:
                for v in (value if fd.is_repeated else (value,)):
                    shown = _scalar(fd, v, owner)  # exactly what the decoded tree shows
                    if isinstance(shown, dict) and "$hex" in shown:
                        self._hit(here, OPAQUE, root, nums, owner, at, lambda v=v: guess_bytes(v))
                        break
        try:
            unknown = list(UnknownFieldSet(msg))
        except Exception:  # pragma: no cover - runtime without the unknown-field API
            return
        done: set[int] = set()
        for uf in unknown:
            if uf.field_number in done:
                continue
            done.add(uf.field_number)
            self._hit(f"{path}.{uf.field_number}", UNKNOWN_FIELD, root, (*numbers, uf.field_number), owner, at,
                      lambda uf=uf: guess_bytes(uf.data) if uf.wire_type == 2 else
                      ("(group)" if uf.wire_type == 3 else uf.data))


def _numbers_of_kind(schema: Schema, msg_type: str, kind: str) -> tuple[tuple[int, ...], str | None] | None:
    """Field numbers along a dotted kind, and the owner of its last step; None when the schema names
    the whole kind (then it is no drift for this schema) or a name in it does not exist."""
    if not schema.has(msg_type):
        return None
    desc: Descriptor | None = schema.descriptor(msg_type)
    numbers: list[int] = []
    owner = None
    parts = kind.split(".")
    for i, part in enumerate(parts):
        if desc is None:
            return None
        owner = desc.full_name
        if part.isdigit():
            n = int(part)
            if n in desc.fields_by_number or i != len(parts) - 1:
                return None
            numbers.append(n)
            return tuple(numbers), owner
        fd = desc.fields_by_name.get(part)
        if fd is None:
            return None
        numbers.append(fd.number)
        desc = fd.message_type
    return None


def named_in(schema: Schema, root: str, numbers: tuple[int, ...], what: str) -> NamedBy | None:
    """How ``schema`` names a drift path: its field name and type, or None when it does not."""
    if not schema.has(root):
        return None
    if what == UNKNOWN_TYPE:
        return {"name": root, "type": "message"}
    desc: Descriptor | None = schema.descriptor(root)
    fd: FieldDescriptor | None = None
    for n in numbers:
        if desc is None:
            return None
        fd = desc.fields_by_number.get(n)
        if fd is None:
            return None
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            mt = mt.fields_by_name["value"].message_type
        desc = mt
    if fd is None:
        return None
    if what == OPAQUE and fd.type != _TYPE_MESSAGE:
        return None  # still bytes (or a scalar) there: it does not say what the bytes are
    return {"name": fd.name, "type": _type_text(fd), "owner": fd.containing_type.full_name}


def _type_text(fd: FieldDescriptor) -> str:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        k, v = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return field_type({"map": (_type_name(k), _type_name(v), _ref(v))})
    label = "LABEL_REPEATED" if fd.is_repeated else "LABEL_OPTIONAL"
    return field_type({"type": _type_name(fd), "type_name": _ref(fd), "label": label})


def _type_name(fd: FieldDescriptor) -> str:
    return _TYPE_ENUM_NAMES[fd.type]


def _ref(fd: FieldDescriptor) -> str | None:
    t = fd.message_type or fd.enum_type
    return t.full_name if t is not None else None


_TYPE_ENUM_NAMES = {v: k for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_") and isinstance(v, int)}


Reader = LocalReader | RemoteReader


def payload_pages(reader: Reader, sample: int | None) -> Iterator[list[PayloadRow]]:
    """The walkable frames (with their session's client version), a bounded page at a time."""
    versions = reads.client_versions(reader)
    if sample is None:
        for sid in versions:
            last = -1
            while True:
                rows = reads.walkable_page(reader, sid, last, PAGE_ROWS).to_pylist()
                if not rows:
                    break
                for r in rows:
                    r["client_version"] = versions.get(sid)
                yield rows
                last = rows[-1]["seq"]
                if len(rows) < PAGE_ROWS:
                    break
        return
    by_session: dict[str, list[int]] = {}
    for k in reads.walkable_sample(reader, sample).to_pylist():
        by_session.setdefault(k["session_id"], []).append(k["seq"])
    for sid, seqs in by_session.items():
        for i in range(0, len(seqs), PAGE_ROWS):
            rows = reads.frames_at(reader, sid, seqs[i:i + PAGE_ROWS]).to_pylist()
            for r in rows:
                r["client_version"] = versions.get(sid)
            yield rows


def drift(reader: Reader, schema: Schema, *, against: Schema | None = None, sample: int | None = None
          ) -> DriftReport:
    """Drift paths of every capture in the database, read with ``schema``; ``against`` is checked too."""
    total = reads.walkable_count(reader)
    walker = _Walker(schema)
    walked = 0
    for rows in payload_pages(reader, sample):
        for r in rows:
            walker.frame(r["session_id"], r["seq"], r["ts"], r["client_version"], r["msg_type"], r["payload"])
        walked += len(rows)
    paths = walker.paths
    # Numbered frame kinds, counted exactly whatever was sampled (one aggregate).
    numbered = reads.numbered_kinds(reader).to_pylist()
    for row in numbered:
        found = _numbers_of_kind(schema, row["msg_type"], row["kind"])
        if found is None:
            continue  # this schema names what the recording's schema did not
        key = f"{row['msg_type'].rsplit('.', 1)[-1]}.{row['kind']}"
        p = paths.get(key)
        if p is None:
            p = paths[key] = DriftPath(key, UNKNOWN_FIELD, row["msg_type"], found[0], found[1])
        p.frames = row["n"]
        p.sessions = set(row["sessions"])
        p.first_seen, p.last_seen = row["first"], row["last"]
        p.client_versions = set((row["versions"] or [])[:MAX_VERSIONS])
    if against is not None:
        for p in paths.values():
            p.named = named_in(against, p.root, p.numbers, p.what)
    recorded = cast(list[RecordedSchema], reads.recording_schemas(reader).to_pylist())
    ordered = sorted(paths.values(), key=lambda p: (-p.frames, p.path))
    return DriftReport(ordered, total, walked, sample, recorded)

"""Decoding as far as the bytes go, when a frame and the schema disagree about a field.

A frame from an older or newer build than the schema can carry, at a field number the schema knows,
something of another type: a varint where the schema has a message, a string where it has a
message, bytes that are not UTF-8 where it has a string. The protobuf runtime then rejects the whole
message (a sub-message that does not parse, bad UTF-8) or files the field among the unknown fields
(an unexpected wire type), and either way the frame loses the kind its other fields give it.

``repair`` walks the wire format with the schema. Every field that fits is kept byte for byte; one
that does not is recorded as a ``Mismatch`` (path, number, what the schema expects, what came) and
replaced: a message-typed field by an empty message, so a oneof member stays set and the frame keeps
the kind of the path that did parse; any other field is dropped. The caller parses the repaired
bytes with the runtime and shows each mismatch schemaless. Bytes that are broken at the wire level
(a varint or length running past the end, a reserved wire type, an unbalanced group, field number 0)
raise ``WireError``: those frames stay ``malformed``.

Only failure paths call this; classification of a frame the runtime parses cleanly never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from workbench.nesting import NESTING_LIMIT
from workbench.wire.varint import encode_varint, read_varint

__all__ = ["MAX_DEPTH", "MAX_FOUND", "Found", "Mismatch", "WireError", "known_unknowns", "repair",
           "type_name"]

# The runtime's own nesting limit (deeper input is refused there too), the one every reader of
# nested input shares (``workbench.nesting``).
MAX_DEPTH = NESTING_LIMIT
# Mismatches recorded per frame; more are counted (``Found.omitted``).
MAX_FOUND = 64
WIRE_NAMES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group", 5: "32-bit"}
_FD = FieldDescriptor
_WIRE_OF_TYPE = {
    **dict.fromkeys((_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_SINT32,
                     _FD.TYPE_SINT64, _FD.TYPE_BOOL, _FD.TYPE_ENUM), 0),
    **dict.fromkeys((_FD.TYPE_DOUBLE, _FD.TYPE_FIXED64, _FD.TYPE_SFIXED64), 1),
    **dict.fromkeys((_FD.TYPE_FLOAT, _FD.TYPE_FIXED32, _FD.TYPE_SFIXED32), 5),
    **dict.fromkeys((_FD.TYPE_STRING, _FD.TYPE_BYTES, _FD.TYPE_MESSAGE), 2),
    _FD.TYPE_GROUP: 3,
}
_TYPE_NAMES = {v: k[5:].lower() for k, v in vars(_FD).items() if k.startswith("TYPE_") and isinstance(v, int)}
_MAX_NUMBER = (1 << 29) - 1
_DEFAULT_VALUE = {0: b"\x00", 1: bytes(8), 2: b"\x00", 5: bytes(4)}
_VERIFY_UTF8 = 2  # google.protobuf.FeatureSet.VERIFY


class WireError(ValueError):
    """The bytes are not protobuf wire format at all (not a schema question)."""


@dataclass(slots=True)
class Mismatch:
    """One field whose bytes do not fit the schema's type.

    ``path`` is the dotted field path from the top message (``exec_server_message.git_diff_request_args``);
    ``steps`` the same as (name, occurrence) pairs, the occurrence counting earlier fields of the same
    number in the same message (so a repeated field's element can be found); ``value`` the field as
    it came (an int for varint and fixed fields, bytes for length-delimited ones and groups).
    """

    path: str
    number: int
    expected: str
    found: str
    wire_type: int
    value: int | bytes
    steps: tuple[tuple[str, int], ...] = ()
    repeated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "field": self.number, "expected": self.expected, "found": self.found}

    def note(self) -> str:
        return f"{self.path} (field {self.number}): schema has {self.expected}, frame has {self.found}"


def type_name(fd: FieldDescriptor) -> str:
    if fd.type == _FD.TYPE_MESSAGE:
        return f"message {fd.message_type.full_name}"
    if fd.type == _FD.TYPE_ENUM:
        return f"enum {fd.enum_type.full_name}"
    return _TYPE_NAMES.get(fd.type, str(fd.type))


def _size(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def _checks_utf8(fd: FieldDescriptor) -> bool:
    try:
        return bool(fd._GetFeatures().utf8_validation == _VERIFY_UTF8)
    except AttributeError:  # pragma: no cover - runtime without editions features: proto3 rules
        return True


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    try:
        return read_varint(buf, pos)
    except IndexError as exc:
        raise WireError(f"truncated or over-long varint at byte {pos}") from exc


def _skip(buf: bytes, pos: int, wire_type: int, number: int, depth: int) -> int:
    """The end of one field's value starting at ``pos`` (after its tag)."""
    n = len(buf)
    if wire_type == 0:
        return _varint(buf, pos)[1]
    if wire_type == 1 or wire_type == 5:
        end = pos + (8 if wire_type == 1 else 4)
    elif wire_type == 2:
        length, pos = _varint(buf, pos)
        end = pos + length
    elif wire_type == 3:
        if depth >= MAX_DEPTH:
            raise WireError("groups nested too deep")
        while True:
            key, pos = _varint(buf, pos)
            if key & 7 == 4:
                if key >> 3 != number:
                    raise WireError(f"group {number} closed by end-group {key >> 3}")
                return pos
            if key >> 3 == 0:
                raise WireError("field number 0")
            pos = _skip(buf, pos, key & 7, key >> 3, depth + 1)
    elif wire_type == 4:
        raise WireError(f"end-group {number} without its start")
    else:
        raise WireError(f"reserved wire type {wire_type} (field {number})")
    if end > n:
        raise WireError(f"field {number} runs past the end ({end} > {n} bytes)")
    return end


def _packed_ok(data: bytes, wire_type: int) -> bool:
    if wire_type == 1 or wire_type == 5:
        return len(data) % (8 if wire_type == 1 else 4) == 0
    pos = 0
    try:
        while pos < len(data):
            pos = read_varint(data, pos)[1]
    except IndexError:
        return False
    return True


class Found(list[Mismatch]):
    """The mismatches of one message: the first ``MAX_FOUND`` kept, the rest counted (``omitted``),
    so a hostile frame of thousands of disagreeing fields costs a count, not a record each."""

    omitted = 0

    def record(self, m: Mismatch) -> None:
        if len(self) < MAX_FOUND:
            self.append(m)
        else:
            self.omitted += 1

    @property
    def full(self) -> bool:
        return len(self) >= MAX_FOUND


# Per message descriptor: field number → (field, the wire type its type takes, what to check when
# the wire type matches: 0 nothing, 1 UTF-8, 2 the sub-message; its placeholder; whether a
# length-delimited value may be a packed run of it).
_Entry = tuple[FieldDescriptor, int, int, bytes, bool]
_TABLES: dict[Descriptor, dict[int, _Entry]] = {}


def _table(desc: Descriptor) -> dict[int, _Entry]:
    table = _TABLES.get(desc)
    if table is None:
        table = _TABLES[desc] = {}
        for fd in desc.fields:
            want = _WIRE_OF_TYPE.get(fd.type, 2)
            check = 2 if fd.type == _FD.TYPE_MESSAGE else 1 if fd.type == _FD.TYPE_STRING and _checks_utf8(fd) else 0
            table[fd.number] = (fd, want, check, _placeholder(fd), fd.is_repeated and want in (0, 1, 5))
    return table


def repair(buf: bytes, desc: Descriptor, found: Found, path: str = "",
           steps: tuple[tuple[str, int], ...] = (), depth: int = 0) -> bytes:
    """``buf`` (a ``desc`` message) with every field that does not fit the schema replaced.

    Records one ``Mismatch`` per such field in ``found``; returns ``buf`` itself when nothing had
    to change. Raises ``WireError`` when the bytes are not wire format.
    """
    if depth > MAX_DEPTH:
        raise WireError("messages nested too deep")
    table = _table(desc)
    out: bytearray | None = None
    seen: dict[int, int] = {}
    copied = pos = start = 0
    n = len(buf)
    try:
        while pos < n:
            start = pos
            key = buf[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = read_varint(buf, pos)
            number, wire_type = key >> 3, key & 7
            if number == 0 or number > _MAX_NUMBER:
                raise WireError(f"field number {number} at byte {start}")
            value_at = data_at = pos
            if wire_type == 0:
                pos = read_varint(buf, pos)[1]
            elif wire_type == 2:
                length = buf[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = read_varint(buf, pos)
                data_at = pos
                pos += length
                if pos > n:
                    raise WireError(f"field {number} runs past the end ({pos} > {n} bytes)")
            else:
                pos = _skip(buf, pos, wire_type, number, depth)
            entry = table.get(number)
            if entry is None:
                continue  # unknown to the schema: the runtime keeps it as an unknown field
            fd, want, check, placeholder, packable = entry
            repl: bytes | None = None
            if wire_type == want:
                if check == 0:
                    continue
                if check == 1 and buf[data_at:pos].isascii():
                    continue  # the common string, checked without a call
            elif found.full and not (wire_type == 2 and packable):
                found.omitted += 1  # counted, not described: a hostile frame may hold thousands
                repl = placeholder
            if repl is None:
                index = seen.get(number, 0)
                seen[number] = index + 1
                repl = _fit(buf, start, value_at, pos, wire_type, fd, want, check, path,
                            (*steps, (fd.name, index)), depth, found)
                if repl is None:
                    continue
            if out is None:
                out = bytearray()
            out += buf[copied:start]
            out += repl
            copied = pos
    except IndexError as exc:
        raise WireError(f"truncated or over-long varint in the field at byte {start}") from exc
    if out is None:
        return buf
    out += buf[copied:]
    return bytes(out)


def _fit(buf: bytes, start: int, value_at: int, end: int, wire_type: int, fd: FieldDescriptor, want: int,
         check: int, path: str, steps: tuple[tuple[str, int], ...], depth: int, found: Found) -> bytes | None:
    """None when the field fits its schema type, else the bytes to put in its place."""
    name = f"{path}.{fd.name}" if path else fd.name
    if wire_type != want:
        if wire_type == 2 and fd.is_repeated and want in (0, 1, 5):
            length, at = _varint(buf, value_at)
            if _packed_ok(buf[at:end], want):
                return None  # a packed repeated scalar: fits
            what = f"{_size(length)} that are not packed {WIRE_NAMES[want]} values"
        else:
            what = WIRE_NAMES.get(wire_type, str(wire_type))
        found.record(Mismatch(name, fd.number, type_name(fd), what, wire_type,
                              _value(buf, value_at, end, wire_type), steps, fd.is_repeated))
        return _placeholder(fd)
    length, at = _varint(buf, value_at)
    data = buf[at:end]
    if check == 2:
        mark, omitted = len(found), found.omitted
        try:
            fixed = repair(data, fd.message_type, found, name, steps, depth + 1)
        except WireError as exc:
            del found[mark:]  # the whole sub-message is replaced: what was found inside it goes too
            found.omitted = omitted
            found.record(Mismatch(name, fd.number, type_name(fd), f"{_size(length)} that are not a message ({exc})",
                                  wire_type, data, steps, fd.is_repeated))
            return _placeholder(fd)
        if fixed is data:
            return None
        return buf[start:value_at] + encode_varint(len(fixed)) + fixed
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        found.record(Mismatch(name, fd.number, type_name(fd), f"{_size(length)} that are not UTF-8",
                              wire_type, data, steps, fd.is_repeated))
        return _placeholder(fd)
    return None


def _value(buf: bytes, value_at: int, end: int, wire_type: int) -> int | bytes:
    if wire_type == 0:
        return read_varint(buf, value_at)[0]
    if wire_type in (1, 5):
        return int.from_bytes(buf[value_at:end], "little")
    if wire_type == 2:
        return buf[_varint(buf, value_at)[1]:end]
    return buf[value_at:end]


def _placeholder(fd: FieldDescriptor) -> bytes:
    """The field's default value in the wire type the schema expects, so a oneof member (and a
    field's presence) stays set: an empty message, an empty string, zero. An element of a repeated
    scalar field is dropped instead (a zero would read as a value)."""
    want = _WIRE_OF_TYPE.get(fd.type, 2)
    if want == 3 or (fd.is_repeated and fd.type != _FD.TYPE_MESSAGE):
        return b""
    return encode_varint(fd.number << 3 | want) + _DEFAULT_VALUE[want]


def known_unknowns(numbers: list[int], desc: Descriptor) -> bool:
    """True when the runtime filed a field the schema knows among the unknown fields (wrong wire type)."""
    by_number = desc.fields_by_number
    return any(n in by_number for n in numbers)

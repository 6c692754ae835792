"""protobuf-es v2: the serialized FileDescriptorProtos that generated code embeds.

v2 code calls ``fileDesc("<base64>", [imports…])``; the minifier renames ``fileDesc`` but cannot
touch the string. A serialized FileDescriptorProto starts with field 1 (the file name, tag
``0x0a``), so its base64 starts with ``C``: every string literal ``"C…"`` of base64 characters is
decoded and kept when it parses as a FileDescriptorProto with a file name. A string whose first
bytes are a plausible file name but whose rest does not parse is reported as a broken descriptor.

protobuf-es strips three things before embedding (``embedFileDesc`` in @bufbuild/protobuf v2):
``dependency`` (restored at run time from the imports array), ``source_code_info``, and every
``json_name`` equal to ``protoCamelCase(name)``. ``restore`` puts back what can be known: json
names, and dependencies computed from the types the file refers to (``build.py``).
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass, field

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from workbench.schema.render import proto_camel_case

# Literal-first patterns (fast skipping); the closing quote is checked in Python.
_B64 = {q: re.compile(q + r"(C[A-Za-z0-9+/_\-]{14,}(?:={0,2}))") for q in ('"', "'", "`")}
_NAME_HEAD = re.compile(rb"\x0a([\x01-\x7f])([\x20-\x7e]+)")


@dataclass
class EmbeddedFile:
    proto: descriptor_pb2.FileDescriptorProto
    path: str
    pos: int


@dataclass
class V2Scan:
    files: list[EmbeddedFile] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)


def b64decode(text: str) -> bytes:
    """protobuf-es's base64Decode: standard or URL alphabet, padding optional, inner padding allowed,
    white-space ignored. Raises ValueError on anything else."""
    cleaned = re.sub(r"[\s]", "", text).replace("-", "+").replace("_", "/")
    out = bytearray()
    for chunk in re.split(r"=+", cleaned):
        if not chunk:
            continue
        if len(chunk) % 4 == 1:
            raise ValueError("invalid base64 string")
        try:
            out += binascii.a2b_base64(chunk + "=" * (-len(chunk) % 4), strict_mode=True)
        except binascii.Error as exc:
            raise ValueError(f"invalid base64 string: {exc}") from exc
    return bytes(out)


def restore(fd: descriptor_pb2.FileDescriptorProto) -> None:
    """Put back the json names protobuf-es stripped (dependencies are computed by the caller)."""

    def fix_fields(fields: list[descriptor_pb2.FieldDescriptorProto]) -> None:
        for f in fields:
            if not f.HasField("json_name"):
                f.json_name = proto_camel_case(f.name)

    def walk(m: descriptor_pb2.DescriptorProto) -> None:
        fix_fields(list(m.field))
        fix_fields(list(m.extension))
        for n in m.nested_type:
            walk(n)

    for m in fd.message_type:
        walk(m)
    fix_fields(list(fd.extension))


def scan(path: str, s: str) -> V2Scan:
    out = V2Scan()
    for quote, pattern in _B64.items():
        if s.find(quote + "C") < 0:
            continue
        for m in pattern.finditer(s):
            text = m.group(1)
            end = m.end()
            closed = s[end:end + 1] == quote
            if not closed and end < len(s):
                continue  # some other string that merely starts like base64
            _one(path, m.start(), text, closed, out)
    return out


def _one(path: str, pos: int, text: str, closed: bool, out: V2Scan) -> None:
    if not closed:
        text = text[: len(text) - len(text) % 4]  # the whole groups of a string cut off by the end of file
    try:
        data = b64decode(text)
    except ValueError:
        return
    head = _NAME_HEAD.match(data)
    name_bytes = head.group(2)[: head.group(1)[0]] if head else b""
    complete = head is not None and len(head.group(2)) >= head.group(1)[0]
    plausible = complete and name_bytes.endswith(b".proto")
    name = name_bytes.decode("ascii", "replace")
    if not closed:
        if plausible or (head is not None and not complete and re.fullmatch(rb"[\w./\-]+", name_bytes)):
            out.errors.append((pos, f"embedded file descriptor {name + ('' if complete else '…')!r} is cut off "
                                    "(the file ends inside it)"))
        return
    fd = descriptor_pb2.FileDescriptorProto()
    try:
        fd.ParseFromString(data)
    except DecodeError as exc:
        if plausible:
            out.errors.append((pos, f"embedded file descriptor {name!r} does not parse: {exc}"))
        return
    if not fd.name or not (fd.message_type or fd.enum_type or fd.service or fd.extension) and not plausible:
        return
    if not isinstance(fd.name, str) or not re.fullmatch(r"[\w./\-]+", fd.name):
        return
    bad = _insane(fd)
    if bad:
        out.errors.append((pos, f"embedded file descriptor {fd.name!r} does not parse: {bad}"))
        return
    restore(fd)
    out.files.append(EmbeddedFile(fd, path, pos))


_IDENT = re.compile(r"[A-Za-z_]\w*")
_TYPE_REF = re.compile(r"\.?[A-Za-z_][\w.]*")


def _insane(fd: descriptor_pb2.FileDescriptorProto) -> str | None:
    """What makes a descriptor that parsed unusable (garbage names from a corrupted string), if anything."""
    def name_ok(n: object) -> bool:
        return isinstance(n, str) and _IDENT.fullmatch(n) is not None

    def ref_ok(n: object) -> bool:
        return isinstance(n, str) and (n == "" or _TYPE_REF.fullmatch(n) is not None)

    if not isinstance(fd.package, str) or (fd.package and not _TYPE_REF.fullmatch(fd.package)):
        return "package name is not an identifier"

    def walk(m: descriptor_pb2.DescriptorProto) -> str | None:
        if not name_ok(m.name):
            return f"message name {m.name!r}"
        for f in list(m.field) + list(m.extension):
            if not name_ok(f.name) or not ref_ok(f.type_name) or not ref_ok(f.extendee) or f.number <= 0:
                return f"field {f.name!r} of {m.name}"
        for e in m.enum_type:
            if not name_ok(e.name) or not all(name_ok(v.name) for v in e.value):
                return f"enum {e.name!r}"
        for n in m.nested_type:
            found = walk(n)
            if found:
                return found
        return None

    for m in fd.message_type:
        found = walk(m)
        if found:
            return "corrupt " + found
    for e in fd.enum_type:
        if not name_ok(e.name) or not all(name_ok(v.name) for v in e.value):
            return f"corrupt enum {e.name!r}"
    for sv in fd.service:
        if not name_ok(sv.name) or not all(name_ok(x.name) and ref_ok(x.input_type) and ref_ok(x.output_type)
                                           for x in sv.method):
            return f"corrupt service {sv.name!r}"
    return None

"""Write a FileDescriptorProto as ``.proto`` source that protoc compiles back to the same descriptor.

Type references are written fully qualified (``.agent.v1.Foo``) so no scoping rule can change
what they mean; map entries become ``map<K, V>``; proto3 ``optional`` fields keep their keyword
and their synthetic oneofs are left implicit; proto2 groups are written as groups when their
message is nested next to them. Comments carry what the caller wants said per type (for
extraction: where in the bundle it was found).
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf import descriptor_pb2

FDP = descriptor_pb2.FieldDescriptorProto
_TYPE_NAMES = {FDP.TYPE_DOUBLE: "double", FDP.TYPE_FLOAT: "float", FDP.TYPE_INT64: "int64",
               FDP.TYPE_UINT64: "uint64", FDP.TYPE_INT32: "int32", FDP.TYPE_FIXED64: "fixed64",
               FDP.TYPE_FIXED32: "fixed32", FDP.TYPE_BOOL: "bool", FDP.TYPE_STRING: "string",
               FDP.TYPE_BYTES: "bytes", FDP.TYPE_UINT32: "uint32", FDP.TYPE_SFIXED32: "sfixed32",
               FDP.TYPE_SFIXED64: "sfixed64", FDP.TYPE_SINT32: "sint32", FDP.TYPE_SINT64: "sint64"}
_IDEMPOTENCY = {1: "NO_SIDE_EFFECTS", 2: "IDEMPOTENT"}
Comment = Callable[[str], str | None]


def _quote(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\"\\":
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def proto_camel_case(name: str, cap_first: bool = False) -> str:
    """protoc's default ``json_name`` (protobuf-es ``protoCamelCase`` is the same): a letter after
    an underscore is upper-cased, the underscores go. ``cap_first`` upper-cases the first letter
    too (protoc's map entry names)."""
    out: list[str] = []
    cap = cap_first
    for c in name:
        if c == "_":
            cap = True
        elif cap:
            out.append(c.upper())
            cap = False
        else:
            out.append(c)
    return "".join(out)


def render_file(fd: descriptor_pb2.FileDescriptorProto, comment: Comment | None = None,
                header: str = "") -> str:
    lines: list[str] = []
    if header:
        lines += [f"// {ln}" if ln else "//" for ln in header.splitlines()]
    if fd.syntax == "editions":
        lines.append(f'edition = "{_edition(fd)}";')
    else:
        lines.append(f'syntax = "{fd.syntax or "proto2"}";')
    if fd.package:
        lines += ["", f"package {fd.package};"]
    if fd.dependency:
        lines.append("")
        public = set(fd.public_dependency)
        for i, dep in enumerate(fd.dependency):
            lines.append(f'import {"public " if i in public else ""}"{dep}";')
    proto3 = fd.syntax == "proto3"
    for e in fd.enum_type:
        lines.append("")
        _enum(e, (fd.package + "." if fd.package else "") + e.name, "", lines, comment)
    for m in fd.message_type:
        lines.append("")
        _message(m, (fd.package + "." if fd.package else "") + m.name, "", lines, comment, proto3)
    for ext_block in _extensions(list(fd.extension), "", proto3):
        lines.append("")
        lines += ext_block
    for s in fd.service:
        lines.append("")
        full = (fd.package + "." if fd.package else "") + s.name
        _comment(full, "", lines, comment)
        lines.append(f"service {s.name} {{")
        for meth in s.method:
            ins = ("stream " if meth.client_streaming else "") + meth.input_type
            outs = ("stream " if meth.server_streaming else "") + meth.output_type
            level = meth.options.idempotency_level if meth.HasField("options") else 0
            if level:
                lines.append(f"  rpc {meth.name}({ins}) returns ({outs}) {{")
                lines.append(f"    option idempotency_level = {_IDEMPOTENCY.get(level, level)};")
                lines.append("  }")
            else:
                lines.append(f"  rpc {meth.name}({ins}) returns ({outs});")
        lines.append("}")
    return "\n".join(lines) + "\n"


def _edition(fd: descriptor_pb2.FileDescriptorProto) -> str:
    name = descriptor_pb2.Edition.Name(fd.edition) if fd.edition else "EDITION_2023"
    return name.removeprefix("EDITION_")


def _comment(full: str, indent: str, lines: list[str], comment: Comment | None) -> None:
    text = comment(full) if comment else None
    if text:
        lines += [f"{indent}// {ln}" for ln in text.splitlines()]


def _enum(e: descriptor_pb2.EnumDescriptorProto, full: str, indent: str, lines: list[str],
          comment: Comment | None) -> None:
    _comment(full, indent, lines, comment)
    lines.append(f"{indent}enum {e.name} {{")
    if e.options.allow_alias:
        lines.append(f"{indent}  option allow_alias = true;")
    for v in e.value:
        opts = " [deprecated = true]" if v.options.deprecated else ""
        lines.append(f"{indent}  {v.name} = {v.number}{opts};")
    _reserved(e.reserved_range, e.reserved_name, indent, lines, inclusive=True)
    lines.append(f"{indent}}}")


def _reserved(ranges: object, names: object, indent: str, lines: list[str], inclusive: bool) -> None:
    parts = []
    for r in ranges:  # type: ignore[attr-defined]
        end = r.end if inclusive else r.end - 1
        parts.append(str(r.start) if end == r.start else f"{r.start} to {'max' if end >= 0x1FFFFFFF else end}")
    if parts:
        lines.append(f"{indent}  reserved {', '.join(parts)};")
    if names:
        lines.append(f"{indent}  reserved {', '.join(_quote(n) for n in names)};")  # type: ignore[attr-defined]


def _field_type(f: descriptor_pb2.FieldDescriptorProto) -> str:
    if f.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM, FDP.TYPE_GROUP):
        return f.type_name
    return _TYPE_NAMES[f.type]


def _options(f: descriptor_pb2.FieldDescriptorProto, proto3: bool) -> str:
    opts: list[str] = []
    if f.HasField("default_value"):
        if f.type in (FDP.TYPE_STRING,):
            opts.append(f"default = {_quote(f.default_value)}")
        elif f.type == FDP.TYPE_BYTES:
            opts.append(f'default = "{f.default_value}"')
        else:
            opts.append(f"default = {f.default_value}")
    if f.HasField("json_name") and f.json_name != proto_camel_case(f.name):
        opts.append(f"json_name = {_quote(f.json_name)}")
    if f.options.HasField("packed"):
        opts.append(f"packed = {'true' if f.options.packed else 'false'}")
    if f.options.HasField("jstype"):
        opts.append(f"jstype = {descriptor_pb2.FieldOptions.JSType.Name(f.options.jstype)}")
    if f.options.deprecated:
        opts.append("deprecated = true")
    return f" [{', '.join(opts)}]" if opts else ""


def _label(f: descriptor_pb2.FieldDescriptorProto, proto3: bool, in_oneof: bool) -> str:
    if f.label == FDP.LABEL_REPEATED:
        return "repeated "
    if f.label == FDP.LABEL_REQUIRED:
        return "required "
    if in_oneof:
        return ""
    if proto3:
        return "optional " if f.proto3_optional else ""
    return "optional "


def _message(m: descriptor_pb2.DescriptorProto, full: str, indent: str, lines: list[str],
             comment: Comment | None, proto3: bool) -> None:
    _comment(full, indent, lines, comment)
    lines.append(f"{indent}message {m.name} {{")
    inner = indent + "  "
    entries = {f"{full}.{n.name}": n for n in m.nested_type if n.options.map_entry}
    groups = {f"{full}.{n.name}": n for n in m.nested_type
              if any(f.type == FDP.TYPE_GROUP and f.type_name.lstrip(".") == f"{full}.{n.name}" for f in m.field)}
    real_oneofs = [i for i, _o in enumerate(m.oneof_decl)
                   if not any(f.proto3_optional and f.oneof_index == i for f in m.field if f.HasField("oneof_index"))]
    if m.options.message_set_wire_format:
        lines.append(f"{inner}option message_set_wire_format = true;")
    emitted_oneofs: set[int] = set()
    for f in m.field:
        if f.HasField("oneof_index") and f.oneof_index in real_oneofs:
            if f.oneof_index in emitted_oneofs:
                continue
            emitted_oneofs.add(f.oneof_index)
            lines.append(f"{inner}oneof {m.oneof_decl[f.oneof_index].name} {{")
            for g in m.field:
                if g.HasField("oneof_index") and g.oneof_index == f.oneof_index:
                    _field(g, full, inner + "  ", lines, comment, proto3, entries, groups, True)
            lines.append(f"{inner}}}")
            continue
        _field(f, full, inner, lines, comment, proto3, entries, groups, False)
    for e in m.enum_type:
        _enum(e, f"{full}.{e.name}", inner, lines, comment)
    for n in m.nested_type:
        key = f"{full}.{n.name}"
        if key in entries or key in groups:
            continue
        _message(n, key, inner, lines, comment, proto3)
    for r in m.extension_range:
        end = r.end - 1
        lines.append(f"{inner}extensions {r.start}" + ("" if end == r.start else f" to {'max' if end >= 0x1FFFFFFE else end}") + ";")
    _reserved(m.reserved_range, m.reserved_name, indent, lines, inclusive=False)
    for block in _extensions(list(m.extension), inner, proto3):
        lines += block
    lines.append(f"{indent}}}")


def _field(f: descriptor_pb2.FieldDescriptorProto, full: str, indent: str, lines: list[str],
           comment: Comment | None, proto3: bool, entries: dict[str, descriptor_pb2.DescriptorProto],
           groups: dict[str, descriptor_pb2.DescriptorProto], in_oneof: bool) -> None:
    entry = entries.get(f.type_name.lstrip(".")) if f.type == FDP.TYPE_MESSAGE else None
    if entry is not None and f.label == FDP.LABEL_REPEATED:
        key, val = entry.field[0], entry.field[1]
        lines.append(f"{indent}map<{_field_type(key)}, {_field_type(val)}> {f.name} = {f.number}{_options(f, proto3)};")
        return
    group = groups.get(f.type_name.lstrip(".")) if f.type == FDP.TYPE_GROUP else None
    if group is not None:
        lines.append(f"{indent}{_label(f, proto3, in_oneof)}group {group.name} = {f.number}{_options(f, proto3)} {{")
        for g in group.field:
            _field(g, f.type_name.lstrip("."), indent + "  ", lines, comment, proto3, {}, {}, False)
        lines.append(f"{indent}}}")
        return
    ftype = _field_type(f)
    if f.type == FDP.TYPE_GROUP:  # a group whose message is not beside it: write it as a message field
        ftype = f.type_name
    lines.append(f"{indent}{_label(f, proto3, in_oneof)}{ftype} {f.name} = {f.number}{_options(f, proto3)};")


def _extensions(exts: list[descriptor_pb2.FieldDescriptorProto], indent: str, proto3: bool) -> list[list[str]]:
    by_extendee: dict[str, list[descriptor_pb2.FieldDescriptorProto]] = {}
    for f in exts:
        by_extendee.setdefault(f.extendee, []).append(f)
    blocks = []
    for extendee, fields in by_extendee.items():
        block = [f"{indent}extend {extendee} {{"]
        for f in fields:
            block.append(f"{indent}  {_label(f, proto3, False)}{_field_type(f)} {f.name} = {f.number}{_options(f, proto3)};")
        block.append(f"{indent}}}")
        blocks.append(block)
    return blocks

"""Schemas as plain facts, for comparing two of them (an extraction with its source, two versions).

``facts(files)`` flattens FileDescriptorProtos into ``{full type name: {...}}``: per message its
fields by number (name, type, type name, label, oneof, proto3 optional, json name, default, packed,
jstype), map key/value types, nested type names; per enum its values; per service its methods.
Two schemas mean the same on the wire and in JSON exactly when their facts are equal.
``wire_only=True`` leaves out what protobuf-es v1 code does not carry (json names are kept:
v1 carries custom ones).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypedDict

from google.protobuf import descriptor_pb2

FDP = descriptor_pb2.FieldDescriptorProto
_PACKABLE = {FDP.TYPE_DOUBLE, FDP.TYPE_FLOAT, FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_INT32, FDP.TYPE_FIXED64,
             FDP.TYPE_FIXED32, FDP.TYPE_BOOL, FDP.TYPE_UINT32, FDP.TYPE_ENUM, FDP.TYPE_SFIXED32,
             FDP.TYPE_SFIXED64, FDP.TYPE_SINT32, FDP.TYPE_SINT64}


class FieldFacts(TypedDict, total=False):
    """One field: a map field has ``map`` (key type, value type, value type name) instead of
    ``type``/``type_name``/``label``/``packed``/``default``/``jstype``; ``optional`` or ``oneof``
    when the field has either."""

    name: str
    json_name: str | None
    map: tuple[str, str, str | None]
    type: str
    type_name: str | None
    label: str
    packed: bool | None
    default: str | None
    jstype: int | None
    optional: bool
    oneof: str


# a method: input type, output type, client streaming, server streaming, idempotency level
MethodFacts = tuple[str, str, bool, bool, int]


class TypeFacts(TypedDict, total=False):
    """One message (``fields`` by number, ``nested`` names, ``file`` when asked), enum (``values``:
    name, number) or service (``methods`` by name)."""

    kind: Literal["message", "enum", "service"]
    fields: dict[int, FieldFacts]
    nested: list[str]
    file: str
    values: list[tuple[str, int]]
    methods: dict[str, MethodFacts]


def _packed(f: descriptor_pb2.FieldDescriptorProto, syntax: str) -> bool | None:
    if f.label != FDP.LABEL_REPEATED or f.type not in _PACKABLE:
        return None
    if f.options.HasField("packed"):
        return f.options.packed
    return syntax == "proto3"


def facts(files: Iterable[descriptor_pb2.FileDescriptorProto], *, skip_packages: tuple[str, ...] = ("google.protobuf",),
          with_files: bool = False) -> dict[str, TypeFacts]:
    out: dict[str, TypeFacts] = {}
    for fd in files:
        if fd.package in skip_packages:
            continue
        prefix = fd.package + "." if fd.package else ""
        maps: dict[str, descriptor_pb2.DescriptorProto] = {}
        for m in fd.message_type:
            _collect_maps(m, prefix, maps)
        for m in fd.message_type:
            _message(m, prefix, fd, maps, with_files, out)
        for e in fd.enum_type:
            out[prefix + e.name] = _enum(e)
        for s in fd.service:
            out[prefix + s.name] = {"kind": "service", "methods": {
                meth.name: (meth.input_type, meth.output_type, meth.client_streaming, meth.server_streaming,
                            meth.options.idempotency_level) for meth in s.method}}
    return out


def _collect_maps(m: descriptor_pb2.DescriptorProto, scope: str, maps: dict[str, descriptor_pb2.DescriptorProto]) -> None:
    for n in m.nested_type:
        if n.options.map_entry:
            maps[scope + m.name + "." + n.name] = n
        _collect_maps(n, scope + m.name + ".", maps)


def _message(m: descriptor_pb2.DescriptorProto, scope: str, fd: descriptor_pb2.FileDescriptorProto,
             maps: dict[str, descriptor_pb2.DescriptorProto], with_files: bool, out: dict[str, TypeFacts]) -> None:
    full = scope + m.name
    syntax = fd.syntax or "proto2"
    fields: dict[int, FieldFacts] = {}
    for f in m.field:
        entry = maps.get(f.type_name.lstrip(".")) if f.type == FDP.TYPE_MESSAGE else None
        info: FieldFacts = {"name": f.name, "json_name": f.json_name or None}
        if entry is not None and f.label == FDP.LABEL_REPEATED:
            k, v = entry.field[0], entry.field[1]
            info["map"] = (FDP.Type.Name(k.type), FDP.Type.Name(v.type), v.type_name or None)
        else:
            info["type"] = FDP.Type.Name(f.type)
            info["type_name"] = f.type_name or None
            info["label"] = FDP.Label.Name(f.label)
            info["packed"] = _packed(f, syntax)
            info["default"] = f.default_value if f.HasField("default_value") else None
            info["jstype"] = f.options.jstype if f.options.HasField("jstype") else None
        if f.HasField("oneof_index"):
            if f.proto3_optional:
                info["optional"] = True
            else:
                info["oneof"] = m.oneof_decl[f.oneof_index].name
        fields[f.number] = info
    entry_names = {n.name for n in m.nested_type if n.options.map_entry}
    out[full] = {"kind": "message", "fields": fields,
                 "nested": sorted(n.name for n in m.nested_type if n.name not in entry_names)
                 + sorted(e.name for e in m.enum_type)}
    if with_files:
        out[full]["file"] = fd.name
    for e in m.enum_type:
        out[full + "." + e.name] = _enum(e)
    for n in m.nested_type:
        if n.name not in entry_names:
            _message(n, full + ".", fd, maps, with_files, out)


def _enum(e: descriptor_pb2.EnumDescriptorProto) -> TypeFacts:
    return {"kind": "enum", "values": [(v.name, v.number) for v in e.value]}

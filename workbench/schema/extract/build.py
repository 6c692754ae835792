"""Turn what the scanners found into FileDescriptorProtos, and say what could not be recovered.

v2 files are taken as embedded (the most faithful source). v1 definitions become one file per
package (and syntax), named after the package (``agent.v1`` → ``agent/v1/agent.proto``), with
nested types placed under their parents, map entries and proto3 ``optional`` oneofs synthesized
as protoc would, and imports computed from the types each file uses. A reference that cannot be
resolved keeps its field, typed ``bytes`` (a message; same wire form) or ``int32`` (an enum), and
is listed in the report. Well-known types (``google.protobuf.*``) are imported, not redefined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2

from workbench.schema.extract.jsread import Call, Opaque, Ref
from workbench.schema.extract.resolve import Resolver
from workbench.schema.extract.v1 import FileScan, Found, syntax_of
from workbench.schema.extract.v2 import EmbeddedFile, proto_camel_case
from workbench.schema.extract.wkt import well_known_enums, well_known_files
from workbench.schema.merge import count_types, referenced_types

FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16, 17, 18}
_METHOD_KINDS = {"Unary": (False, False), "ServerStreaming": (False, True), "ClientStreaming": (True, False),
                 "BiDiStreaming": (True, True), 0: (False, False), 1: (False, True), 2: (True, False),
                 3: (True, True)}
_IDEMPOTENCY = {"NoSideEffects": 1, "Idempotent": 2, 1: 1, 2: 2}


@dataclass
class Problem:
    path: str
    pos: int | None
    text: str

    def __str__(self) -> str:
        where = f"{self.path}: offset {self.pos}" if self.pos is not None else self.path
        return f"{where}: {self.text}"


@dataclass
class Extraction:
    files: list[descriptor_pb2.FileDescriptorProto] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)  # type full name → "file:offset (shape)"
    problems: list[Problem] = field(default_factory=list)
    wkt: set[str] = field(default_factory=set)  # well-known files imported
    scanned: list[tuple[str, int, int]] = field(default_factory=list)  # (path, bytes, definitions)

    def counts(self) -> dict[str, int]:
        m, e, s = count_types(self.files)
        fields = sum(_count_fields(msg) for f in self.files for msg in f.message_type)
        return {"files": len(self.files), "messages": m, "enums": e, "services": s, "fields": fields}


def _count_fields(m: descriptor_pb2.DescriptorProto) -> int:
    if m.options.map_entry:
        return 0
    return len(m.field) + sum(_count_fields(n) for n in m.nested_type)


@dataclass
class _Def:
    found: Found
    scan: FileScan
    syntax: str | None


def build(scans: list[FileScan], embedded: list[EmbeddedFile], problems: list[Problem]) -> Extraction:
    ex = Extraction(problems=problems)
    wkt_files = well_known_files()
    # v2 first: exact descriptors
    v2_types: dict[str, str] = {}
    v2_files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for emb in embedded:
        fd = emb.proto
        if fd.name in v2_files:
            if v2_files[fd.name].SerializeToString(deterministic=True) != fd.SerializeToString(deterministic=True):
                ex.problems.append(Problem(emb.path, emb.pos, f"a different embedded descriptor for {fd.name} "
                                                             "was found first; this one is ignored"))
            continue
        if fd.name in wkt_files.values() or fd.name == "google/protobuf/descriptor.proto":
            ex.wkt.add(fd.name)
            continue
        v2_files[fd.name] = fd
        for name, kind in _all_types(fd):
            v2_types[name] = fd.name
            ex.sources.setdefault(name, []).append(f"{emb.path}:{emb.pos} (v2 {kind})")
    # v1 definitions, first one of each name wins; identical copies only add a source
    defs: dict[str, _Def] = {}
    for sc in scans:
        for f in sorted(sc.found, key=lambda x: x.pos):
            where = f"{sc.path}:{f.pos} ({f.shape})"
            if f.type_name in v2_types:
                ex.sources[f.type_name].append(where)
                continue
            prev = defs.get(f.type_name)
            if prev is None:
                defs[f.type_name] = _Def(f, sc, syntax_of(sc, f.runtime, f.pos))
                ex.sources.setdefault(f.type_name, []).append(where)
            else:
                ex.sources[f.type_name].append(where)
                if prev.found.kind != f.kind or _shape_key(prev.found.body) != _shape_key(f.body):
                    ex.problems.append(Problem(sc.path, f.pos, f"{f.type_name} is defined differently at "
                                                               f"{prev.scan.path}:{prev.found.pos}; the first is used"))
    kinds = {n: d.found.kind for n, d in defs.items()}
    pre = Resolver(scans, kinds, {}, {})
    for d in defs.values():
        if d.syntax is None:
            d.syntax = pre.runtime_syntax(d.scan, d.found.runtime, d.found.pos)
    for fd in v2_files.values():
        kinds.update({n: k for n, k in _all_types(fd) if k in ("message", "enum")})
    wkt_enums = well_known_enums()
    for name in wkt_files:
        kinds.setdefault(name, "enum" if name in wkt_enums else "message")
    messages = {n for n, k in kinds.items() if k == "message"}
    placement = {n: _place(n, messages) for n in defs}
    packages = {n: p[0] for n, p in placement.items()}
    resolver = Resolver(scans, kinds, packages, {n: p[0] for n, p in placement.items()})
    builder = _V1Builder(ex, resolver, defs, placement)
    files = builder.files()
    used_names = set(v2_files)
    for fd in files.values():
        base = fd.name
        n = 2
        while fd.name in used_names:
            fd.name = base[: -len(".proto")] + f"_{n}.proto"
            n += 1
        used_names.add(fd.name)
    out = list(v2_files.values()) + list(files.values())
    # imports from the types each file uses
    home: dict[str, str] = dict(wkt_files)
    for fd in out:
        for name, _kind in _all_types(fd):
            home[name] = fd.name
    for fd in out:
        deps: list[str] = []
        for ref in sorted(referenced_types(fd)):
            target = home.get(ref)
            if target and target != fd.name and target not in deps:
                deps.append(target)
                if target in wkt_files.values():
                    ex.wkt.add(target)
        del fd.dependency[:]
        fd.dependency.extend(deps)
    ex.files = out
    return ex


def _shape_key(body: Any) -> str:
    """Compare two definitions while ignoring where their references point (names differ)."""
    def norm(v: Any) -> Any:
        if isinstance(v, dict):  # localName: how JS code names an enum value, not part of the schema
            return {k: norm(x) for k, x in v.items() if k != "localName"}
        if isinstance(v, list | tuple):
            return [norm(x) for x in v]
        if isinstance(v, Ref | Call | Opaque):
            return "ref"
        return v
    return repr(norm(body))


def _all_types(fd: descriptor_pb2.FileDescriptorProto) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    prefix = fd.package + "." if fd.package else ""

    def walk(m: descriptor_pb2.DescriptorProto, scope: str) -> None:
        name = scope + m.name
        out.append((name, "message"))
        for e in m.enum_type:
            out.append((name + "." + e.name, "enum"))
        for n in m.nested_type:
            walk(n, name + ".")

    for m in fd.message_type:
        walk(m, prefix)
    out += [(prefix + e.name, "enum") for e in fd.enum_type]
    out += [(prefix + s.name, "service") for s in fd.service]
    return out


def _place(full: str, messages: set[str]) -> tuple[str, str | None]:
    """(package, parent message or None) of a v1 type name."""
    parts = full.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in messages:
            pkg, _parent = _place(prefix, messages)
            return pkg, prefix
    return ".".join(parts[:-1]), None


class _V1Builder:
    def __init__(self, ex: Extraction, resolver: Resolver, defs: dict[str, _Def],
                 placement: dict[str, tuple[str, str | None]]) -> None:
        self.ex = ex
        self.resolver = resolver
        self.defs = defs
        self.placement = placement
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        self.enums: dict[str, descriptor_pb2.EnumDescriptorProto] = {}

    def files(self) -> dict[str, descriptor_pb2.FileDescriptorProto]:
        wkt = well_known_files()
        syntax_of_pkg: dict[tuple[str, str], descriptor_pb2.FileDescriptorProto] = {}
        order = sorted(self.defs, key=lambda n: (n.count("."), n))
        built: dict[str, Any] = {}
        for name in order:
            d = self.defs[name]
            if name in wkt:
                self.ex.wkt.add(wkt[name])
                continue
            short = name.rsplit(".", 1)[-1]
            if d.found.kind == "message":
                built[name] = self._message(name, short, d)
            elif d.found.kind == "enum":
                built[name] = self._enum(short, d)
            else:
                built[name] = self._service(short, d)
        children: dict[str, list[str]] = {}
        top: dict[tuple[str, str], list[str]] = {}
        for name in order:
            if name not in built:
                continue
            pkg, parent = self.placement[name]
            if parent is not None and isinstance(built.get(parent), descriptor_pb2.DescriptorProto):
                children.setdefault(parent, []).append(name)
            else:
                top.setdefault((pkg, self._file_syntax(name)), []).append(name)
        rank = {id(sc): i for i, sc in enumerate(self.resolver.scans.values())}

        def key(name: str) -> tuple[int, int]:
            d = self.defs[name]
            return rank.get(id(d.scan), 0), d.found.pos

        def finish(name: str) -> Any:
            holder = built[name]
            for child in sorted(children.get(name, ()), key=key):
                sub = finish(child)
                (holder.nested_type if self.defs[child].found.kind == "message" else holder.enum_type).append(sub)
            return holder

        for (pkg, syntax), names in sorted(top.items(), key=lambda kv: min(key(n) for n in kv[1])):
            fd = descriptor_pb2.FileDescriptorProto()
            fd.name = _file_name(pkg, syntax, any(k[0] == pkg and k[1] != syntax for k in top))
            fd.package = pkg
            if syntax == "proto3":
                fd.syntax = "proto3"
            syntax_of_pkg[(pkg, syntax)] = fd
            for name in sorted(names, key=key):
                kind = self.defs[name].found.kind
                {"message": fd.message_type, "enum": fd.enum_type, "service": fd.service}[kind].append(finish(name))
        return {fd.name: fd for fd in syntax_of_pkg.values()}

    def _file_syntax(self, name: str) -> str:
        d = self.defs[name]
        if d.syntax:
            return d.syntax
        pkg = self.placement[name][0]
        known = [o.syntax for n, o in self.defs.items() if o.syntax and self.placement[n][0] == pkg]
        if known:
            return max(set(known), key=known.count)
        if d.found.kind == "message" and isinstance(d.found.body, list) and any(
                isinstance(f, dict) and ("req" in f or "default" in f or "delimited" in f) for f in d.found.body):
            return "proto2"
        return "proto3"

    def _problem(self, d: _Def, pos: int | None, text: str) -> None:
        self.ex.problems.append(Problem(d.scan.path, pos if pos is not None else d.found.pos, text))

    def _enum(self, short: str, d: _Def) -> descriptor_pb2.EnumDescriptorProto:
        e = descriptor_pb2.EnumDescriptorProto(name=short)
        values = d.found.body if isinstance(d.found.body, list) else []
        if not isinstance(d.found.body, list):
            self._problem(d, None, f"{d.found.type_name}: enum values are not a literal list; enum left empty")
        numbers: set[int] = set()
        for v in values:
            if isinstance(v, dict) and isinstance(v.get("no"), int) and isinstance(v.get("name"), str):
                if v["no"] in numbers:
                    e.options.allow_alias = True
                numbers.add(v["no"])
                e.value.add(name=v["name"], number=v["no"])
            else:
                self._problem(d, None, f"{d.found.type_name}: unreadable enum value {v!r}")
        if not e.value:
            e.value.add(name=short.upper() + "_UNSPECIFIED", number=0)
            self._problem(d, None, f"{d.found.type_name}: no values recovered; a zero value was added")
        return e

    def _service(self, short: str, d: _Def) -> descriptor_pb2.ServiceDescriptorProto:
        s = descriptor_pb2.ServiceDescriptorProto(name=short)
        methods = d.found.body if isinstance(d.found.body, dict) else {}
        for local, m in methods.items():
            if not isinstance(m, dict):
                continue
            meth = s.method.add(name=m.get("name") if isinstance(m.get("name"), str) else local[:1].upper() + local[1:])
            for key, attr in (("I", "input_type"), ("O", "output_type")):
                target = self.resolver.resolve(m.get(key), d.scan, "message", near=d.found.type_name)
                if target is None:
                    self._problem(d, getattr(m.get(key), "pos", None),
                                  f"{d.found.type_name}.{meth.name}: {key} type {_show(m.get(key))} not resolved; "
                                  "written as google.protobuf.Empty")
                    target = "google.protobuf.Empty"
                setattr(meth, attr, "." + target)
            kind = m.get("kind")
            key_ = kind.path.rsplit(".", 1)[-1] if isinstance(kind, Ref) else kind
            streaming = _METHOD_KINDS.get(key_)  # type: ignore[arg-type]
            if streaming is None:
                self._problem(d, None, f"{d.found.type_name}.{meth.name}: method kind {_show(kind)} unknown; unary")
                streaming = (False, False)
            if streaming[0]:
                meth.client_streaming = True
            if streaming[1]:
                meth.server_streaming = True
            idem = m.get("idempotency")
            idem_key = idem.path.rsplit(".", 1)[-1] if isinstance(idem, Ref) else idem
            if idem_key in _IDEMPOTENCY:
                meth.options.idempotency_level = _IDEMPOTENCY[idem_key]  # type: ignore[index,assignment]
        return s

    def _message(self, full: str, short: str, d: _Def) -> descriptor_pb2.DescriptorProto:
        msg = descriptor_pb2.DescriptorProto(name=short)
        body = d.found.body
        if not isinstance(body, list):
            self._problem(d, getattr(body, "pos", None),
                          f"{full}: field list not readable ({_show(body)}); message left without fields")
            return msg
        proto3 = self._file_syntax(full) == "proto3"
        oneofs: dict[str, int] = {}
        synthetic: list[tuple[descriptor_pb2.FieldDescriptorProto, str]] = []
        for info in body:
            if not isinstance(info, dict) or not isinstance(info.get("no"), int) or not isinstance(info.get("name"), str):
                self._problem(d, getattr(info, "pos", None), f"{full}: unreadable field {_show(info)}; skipped")
                continue
            f = msg.field.add(name=info["name"], number=info["no"])
            json_name = info.get("jsonName")
            f.json_name = json_name if isinstance(json_name, str) else proto_camel_case(f.name)
            self._field_type(full, msg, f, info, d)
            if info.get("repeated") is True or info.get("kind") == "map":
                f.label = FDP.LABEL_REPEATED
                if "packed" in info and isinstance(info["packed"], bool):
                    f.options.packed = info["packed"]
            elif info.get("req") is True:
                f.label = FDP.LABEL_REQUIRED
            else:
                f.label = FDP.LABEL_OPTIONAL
            if info.get("L") == 1:
                f.options.jstype = descriptor_pb2.FieldOptions.JS_STRING
            oneof = info.get("oneof")
            if isinstance(oneof, str):
                if oneof not in oneofs:
                    oneofs[oneof] = len(oneofs)
                    msg.oneof_decl.add(name=oneof)
                f.oneof_index = oneofs[oneof]
            elif info.get("opt") is True and proto3 and f.label == FDP.LABEL_OPTIONAL:
                f.proto3_optional = True
                synthetic.append((f, "_" + f.name))
            if "default" in info:
                default = _default_text(info["default"], f, self)
                if default is not None:
                    f.default_value = default
        taken = {o.name for o in msg.oneof_decl} | {f.name for f in msg.field}
        for f, name in synthetic:  # protoc appends synthetic oneofs after the real ones
            while name in taken:
                name = "X" + name
            taken.add(name)
            f.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=name)
        return msg

    def _field_type(self, full: str, msg: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto,
                    info: dict[str, Any], d: _Def) -> None:
        kind = info.get("kind")
        if kind == "map":
            entry = msg.nested_type.add(name=_map_entry_name(f.name))
            entry.options.map_entry = True
            key = entry.field.add(name="key", number=1, label=FDP.LABEL_OPTIONAL, json_name="key")
            key.type = info.get("K") if info.get("K") in _SCALARS else FDP.TYPE_STRING  # type: ignore[assignment]
            val = entry.field.add(name="value", number=2, label=FDP.LABEL_OPTIONAL, json_name="value")
            v = info.get("V") if isinstance(info.get("V"), dict) else {}
            self._set_type(full + "." + f.name + " (map value)", val, v.get("kind"), v.get("T"), d)  # type: ignore[union-attr]
            f.type = FDP.TYPE_MESSAGE
            f.type_name = "." + full + "." + entry.name
            return
        self._set_type(full + "." + f.name, f, kind, info.get("T"), d)
        if kind == "message" and info.get("delimited") is True and f.type == FDP.TYPE_MESSAGE:
            f.type = FDP.TYPE_GROUP

    def _set_type(self, where: str, f: descriptor_pb2.FieldDescriptorProto, kind: Any, t: Any, d: _Def) -> None:
        if kind == "scalar":
            if t in _SCALARS:
                f.type = t
            else:
                f.type = FDP.TYPE_BYTES
                self._problem(d, getattr(t, "pos", None), f"{where}: unknown scalar type {_show(t)}; written as bytes")
            return
        if kind in ("message", "enum"):
            target = self.resolver.resolve(t, d.scan, kind, near=d.found.type_name)
            if target is not None:
                f.type = FDP.TYPE_MESSAGE if kind == "message" else FDP.TYPE_ENUM
                f.type_name = "." + target
                return
            fallback = "bytes" if kind == "message" else "int32"
            f.type = FDP.TYPE_BYTES if kind == "message" else FDP.TYPE_INT32
            self._problem(d, getattr(t, "pos", None), f"{where}: {kind} type reference {_show(t)} not resolved; "
                                                      f"written as {fallback}")
            return
        f.type = FDP.TYPE_BYTES
        self._problem(d, None, f"{where}: unknown field kind {kind!r}; written as bytes")


def _show(v: Any) -> str:
    if isinstance(v, Ref):
        return f"`{v.path}`"
    if isinstance(v, Call):
        return f"`{v.callee}(…)`"
    if isinstance(v, Opaque):
        return f"`{v.text[:40]}`"
    return repr(v)[:60]


def _map_entry_name(field_name: str) -> str:
    """protoc's MapEntryName: CamelCase of the field name plus ``Entry``."""
    return proto_camel_case(field_name, cap_first=True) + "Entry"


def _file_name(pkg: str, syntax: str, split: bool) -> str:
    parts = pkg.split(".") if pkg else []
    stem_parts = [p for p in parts if not (p[:1] == "v" and p[1:2].isdigit())] or parts or ["schema"]
    stem = stem_parts[-1]
    suffix = "_proto2" if split and syntax == "proto2" else ""
    return "/".join([*parts, stem + suffix + ".proto"])


def _default_text(value: Any, f: descriptor_pb2.FieldDescriptorProto, b: _V1Builder) -> str | None:
    """A v1 ``default:`` expression as descriptor ``default_value`` text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and f.type == FDP.TYPE_ENUM:
        return _enum_value_by_number(f.type_name.lstrip("."), value, b)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float):
            return repr(value).replace("inf", "inf")
        return str(value)
    if isinstance(value, str):
        try:  # the bundle was read as latin-1 (byte offsets); literal UTF-8 text is re-decoded here
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value
    if isinstance(value, Call):
        last = value.callee.rsplit(".", 1)[-1]
        if last in ("parse", "uParse") and value.args and isinstance(value.args[0], str):
            return value.args[0]
        if value.callee == "new Uint8Array" and value.args and isinstance(value.args[0], list):
            data = bytes(x for x in value.args[0] if isinstance(x, int))
            return "".join(chr(c) if 32 <= c < 127 and c not in (34, 39, 92) else f"\\{c:03o}" for c in data)
        if value.callee == "new Uint8Array":
            return ""
    if isinstance(value, Ref):
        last = value.path.rsplit(".", 1)[-1]
        if last == "zero":
            return "0"
        if last in ("POSITIVE_INFINITY", "NEGATIVE_INFINITY", "NaN"):
            return {"POSITIVE_INFINITY": "inf", "NEGATIVE_INFINITY": "-inf", "NaN": "nan"}[last]
        if f.type == FDP.TYPE_ENUM:
            return _enum_value_name(f.type_name.lstrip("."), last, b)
    return None


def _enum_value_name(enum_full: str, local: str, b: _V1Builder) -> str:
    d = b.defs.get(enum_full)
    values = d.found.body if d is not None and isinstance(d.found.body, list) else []
    for v in values:
        if isinstance(v, dict) and (v.get("localName") == local or v.get("name") == local):
            return str(v["name"])
    for v in values:
        if isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"].endswith("_" + local):
            return str(v["name"])
    return local


def _enum_value_by_number(enum_full: str, number: int, b: _V1Builder) -> str | None:
    d = b.defs.get(enum_full)
    values = d.found.body if d is not None and isinstance(d.found.body, list) else []
    for v in values:
        if isinstance(v, dict) and v.get("no") == number:
            return str(v["name"])
    return None

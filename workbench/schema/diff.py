"""What changed between two schemas (``workbench schema diff A B``): two Cursor versions, an
extraction and the overlay, an overlay and an edited copy.

Both sides are flattened with ``compare.facts`` (per message its fields by number, per enum its
values, per service its methods) and compared type by type. A field is matched by number first:
the same number under another name is a rename; a name that disappears at one number and appears
at another is a renumbering; what else differs at one number (type, label, oneof, presence,
json name, default, packing) is reported one change each. Fields that come or go inside a oneof
are oneof members added or removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

from google.protobuf import descriptor_pb2

from workbench.schema.compare import FieldFacts, MethodFacts, TypeFacts, facts
from workbench.schema.loader import builtin_descriptor_set, descriptor_hash, load_schema, schema_files
from workbench.schema.merge import count_types
from workbench.schema.render import proto_camel_case

BUILTIN = "builtin"


@dataclass(frozen=True)
class Change:
    """One difference. ``a``/``b``: the value on each side (None where absent)."""

    change: str  # e.g. "field_added", "field_renamed", "message_removed"
    type: str    # full name of the message, enum or service
    field: str | None = None
    number: int | None = None
    a: Any = None
    b: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("a", "b")}


class SideIdentity(TypedDict):
    """What ``schema diff`` says of each side: where it came from, its hash, its type counts."""

    source: str
    hash: str
    messages: int
    enums: int
    services: int


@dataclass(frozen=True)
class Side:
    """One schema being compared: what was given, its own files, and a short identity."""

    spec: str
    files: list[descriptor_pb2.FileDescriptorProto]

    def identity(self) -> SideIdentity:
        """Source, hash (as sessions decoded with it record it) and counts of the compared types."""
        m, e, s = count_types(self.files)
        if self.spec == BUILTIN:
            source, digest = "built-in overlay", load_schema().identity.hash
        else:
            source, digest = self.spec, descriptor_hash(self.files)
        return {"source": source, "hash": digest, "messages": m, "enums": e, "services": s}


def load_side(spec: str | Path) -> Side:
    """``builtin`` or a folder / ``.proto`` file / descriptor set; SchemaError names what failed."""
    if str(spec) == BUILTIN:
        files = [f for f in builtin_descriptor_set().file if not f.name.startswith("google/protobuf/")]
        return Side(BUILTIN, files)
    return Side(str(spec), schema_files([spec]))


def diff(a: Sequence[descriptor_pb2.FileDescriptorProto], b: Sequence[descriptor_pb2.FileDescriptorProto]
         ) -> list[Change]:
    fa, fb = facts(a), facts(b)
    out: list[Change] = []
    for name in sorted(set(fa) | set(fb)):
        x, y = fa.get(name), fb.get(name)
        if x is None:
            assert y is not None  # the name is in one of the two
            out.append(Change(f"{y['kind']}_added", name, b=_type_summary(y)))
        elif y is None:
            out.append(Change(f"{x['kind']}_removed", name, a=_type_summary(x)))
        elif x["kind"] != y["kind"]:
            out.append(Change("kind_changed", name, a=x["kind"], b=y["kind"]))
        elif x["kind"] == "message":
            out += _message_changes(name, x["fields"], y["fields"])
        elif x["kind"] == "enum":
            out += _enum_changes(name, x["values"], y["values"])
        else:
            out += _service_changes(name, x["methods"], y["methods"])
    return out


def _type_summary(t: TypeFacts) -> str:
    if t["kind"] == "message":
        return f"{len(t['fields'])} fields"
    if t["kind"] == "enum":
        return f"{len(t['values'])} values"
    return f"{len(t['methods'])} methods"


def field_type(info: FieldFacts) -> str:
    """A field's type as it would read in a .proto file (``repeated agent.v1.X``, ``map<string, bytes>``)."""
    if "map" in info:
        k, v, vt = info["map"]
        return f"map<{_scalar(k)}, {vt.lstrip('.') if vt else _scalar(v)}>"
    type_name = info.get("type_name")
    base = type_name.lstrip(".") if type_name else _scalar(info["type"])
    label = {"LABEL_REPEATED": "repeated ", "LABEL_REQUIRED": "required "}.get(info.get("label", ""), "")
    if info.get("optional"):
        label = "optional "
    return label + base


def _scalar(type_enum_name: str) -> str:
    return type_enum_name.removeprefix("TYPE_").lower()


_FIELD_PROPS: tuple[tuple[Literal["json_name", "default", "packed", "jstype"], str], ...] = (("json_name", "json_name_changed"), ("default", "default_changed"), ("packed", "packed_changed"),
                ("jstype", "jstype_changed"))


def _message_changes(name: str, fa: dict[int, FieldFacts], fb: dict[int, FieldFacts]) -> list[Change]:
    out: list[Change] = []
    gone = {n: fa[n] for n in fa if n not in fb}
    new = {n: fb[n] for n in fb if n not in fa}
    new_by_name = {info["name"]: n for n, info in new.items()}
    for n in sorted(gone):
        info = gone[n]
        m = new_by_name.get(info["name"])
        if m is not None:
            out.append(Change("field_renumbered", name, info["name"], m, a=n, b=m))
            out += _field_changes(name, info["name"], m, info, new.pop(m))
            continue
        what = "oneof_member_removed" if info.get("oneof") else "field_removed"
        out.append(Change(what, name, info["name"], n, a=_field_text(info), b=None))
    for n in sorted(new):
        info = new[n]
        what = "oneof_member_added" if info.get("oneof") else "field_added"
        out.append(Change(what, name, info["name"], n, a=None, b=_field_text(info)))
    for n in sorted(set(fa) & set(fb)):
        x, y = fa[n], fb[n]
        if x["name"] != y["name"]:
            out.append(Change("field_renamed", name, y["name"], n, a=x["name"], b=y["name"]))
        out += _field_changes(name, y["name"], n, x, y)
    return out


def _field_text(info: FieldFacts) -> str:
    text = field_type(info)
    return f"{text} (oneof {info['oneof']})" if info.get("oneof") else text


def _field_changes(msg: str, field: str, number: int, x: FieldFacts, y: FieldFacts) -> list[Change]:
    out: list[Change] = []
    tx, ty = _type_only(x), _type_only(y)
    if tx != ty:
        out.append(Change("field_type_changed", msg, field, number, a=tx, b=ty))
    lx, ly = _label(x), _label(y)
    if lx != ly:
        out.append(Change("field_label_changed", msg, field, number, a=lx, b=ly))
    if x.get("oneof") != y.get("oneof"):
        out.append(Change("field_oneof_changed", msg, field, number, a=x.get("oneof"), b=y.get("oneof")))
    for key, what in _FIELD_PROPS:
        if (key == "json_name" and x.get(key) == proto_camel_case(x["name"])
                and y.get(key) == proto_camel_case(y["name"])):
            continue  # the default json name of each name: a rename says it already
        if x.get(key) != y.get(key):
            out.append(Change(f"field_{what}", msg, field, number, a=x.get(key), b=y.get(key)))
    return out


def _type_only(info: FieldFacts) -> str:
    if "map" in info:
        return field_type(info)
    type_name = info.get("type_name")
    return type_name.lstrip(".") if type_name else _scalar(info["type"])


def _label(info: FieldFacts) -> str:
    if "map" in info:
        return "map"
    if info.get("optional"):
        return "optional"
    return {"LABEL_REPEATED": "repeated", "LABEL_REQUIRED": "required"}.get(info.get("label", ""), "singular")


def _enum_changes(name: str, va: list[tuple[str, int]], vb: list[tuple[str, int]]) -> list[Change]:
    out: list[Change] = []
    by_name_a, by_name_b = dict(va), dict(vb)
    by_num_a: dict[int, str] = {}
    for k, n in va:
        by_num_a.setdefault(n, k)
    by_num_b: dict[int, str] = {}
    for k, n in vb:
        by_num_b.setdefault(n, k)
    for k, n in va:
        if k in by_name_b:
            if by_name_b[k] != n:
                out.append(Change("enum_value_renumbered", name, k, by_name_b[k], a=n, b=by_name_b[k]))
        elif n in by_num_b and by_num_b[n] not in by_name_a:
            out.append(Change("enum_value_renamed", name, by_num_b[n], n, a=k, b=by_num_b[n]))
        else:
            out.append(Change("enum_value_removed", name, k, n, a=n, b=None))
    for k, n in vb:
        if k not in by_name_a and not (n in by_num_a and by_num_a[n] not in by_name_b):
            out.append(Change("enum_value_added", name, k, n, a=None, b=n))
    return out


def _service_changes(name: str, ma: dict[str, MethodFacts], mb: dict[str, MethodFacts]) -> list[Change]:
    out: list[Change] = []
    for m in sorted(set(ma) | set(mb)):
        x, y = ma.get(m), mb.get(m)
        if x is None:
            assert y is not None  # the name is in one of the two
            out.append(Change("method_added", name, m, b=_method_text(y)))
        elif y is None:
            out.append(Change("method_removed", name, m, a=_method_text(x)))
        elif x != y:
            out.append(Change("method_changed", name, m, a=_method_text(x), b=_method_text(y)))
    return out


def _method_text(m: MethodFacts) -> str:
    inp, outp, cs, ss, _idem = m
    return f"({'stream ' if cs else ''}{inp.lstrip('.')}) returns ({'stream ' if ss else ''}{outp.lstrip('.')})"


# text output ---------------------------------------------------------------------------------

_ADD = {"message_added", "enum_added", "service_added", "field_added", "oneof_member_added", "enum_value_added",
        "method_added"}
_REMOVE = {"message_removed", "enum_removed", "service_removed", "field_removed", "oneof_member_removed",
           "enum_value_removed", "method_removed"}


def change_line(c: Change) -> str:
    """One line for a change inside its type's group (the type is the group's heading)."""
    what = c.change.replace("_", " ")
    if c.change in ("message_added", "enum_added", "service_added"):
        return f"+ {c.change.split('_')[0]} {c.type} ({c.b})"
    if c.change in ("message_removed", "enum_removed", "service_removed"):
        return f"- {c.change.split('_')[0]} {c.type} ({c.a})"
    at = f" {c.number}" if c.number is not None else ""
    if c.change in _ADD:
        return f"+ {what.removesuffix(' added')}{at} {c.field}: {c.b}"
    if c.change in _REMOVE:
        return f"- {what.removesuffix(' removed')}{at} {c.field}: {c.a}"
    change = f"{_show(c.a)} → {_show(c.b)}"
    if c.change == "field_renamed":
        return f"~ field {c.number} renamed: {change}"
    if c.change == "field_renumbered":
        return f"~ field {c.field} renumbered: {change}"
    if c.change == "enum_value_renamed":
        return f"~ value {c.number} renamed: {change}"
    if c.change == "enum_value_renumbered":
        return f"~ value {c.field} renumbered: {change}"
    if c.change == "method_changed":
        return f"~ method {c.field}: {change}"
    prop = what.removeprefix("field ").removesuffix(" changed")
    return f"~ field{at} {c.field} {prop}: {change}"


def _show(v: Any) -> str:
    return "(none)" if v is None else str(v)


def counts(changes: Sequence[Change]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in changes:
        out[c.change] = out.get(c.change, 0) + 1
    return dict(sorted(out.items()))

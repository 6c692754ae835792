"""Overlay coverage: how much of the agent schema our overlay (or any schema) types, and what another
schema has that it lacks.

Counts come from compiled descriptors (grpcio-tools' protoc, as the loader compiles them):

- messages / fields: every message the schema's own files define (nested ones too, map entries not),
  and their fields;
- reachable: messages reachable from the roots (``AgentClientMessage``, ``AgentServerMessage`` and
  the BidiService / ErrorDetails messages the decoder uses), their fields, and the reachable fields
  typed ``bytes``;
- with ``--against DIR|FILE``: the other schema is walked in parallel from the same roots, matching
  fields by number (so renamed types still line up), and the script lists the fields that are
  ``bytes`` here but a message there, the field numbers the other schema has and we lack, the
  messages only it reaches, and name/type disagreements.

    python benchmarks/overlay_coverage.py                       # the built-in overlay
    python benchmarks/overlay_coverage.py --against cursor_proto/ [--json]
    python benchmarks/overlay_coverage.py --schema old_overlay/ --against cursor_proto/
    python benchmarks/overlay_coverage.py --kinds               # dotted oneof kinds the classifier can name
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT, compile_protos

ROOTS = ("agent.v1.AgentServerMessage", "agent.v1.AgentClientMessage", "aiserver.v1.BidiRequestId",
         "aiserver.v1.BidiAppendRequest", "aiserver.v1.BidiPollRequest", "aiserver.v1.BidiPollResponse",
         "aiserver.v1.ErrorDetails")
_ENVELOPES = ("agent.v1.AgentServerMessage", "agent.v1.AgentClientMessage")
_TYPE_NAMES = {v: k[5:].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}


@dataclass
class Schema:
    """A compiled schema: its pool and the names of the files it defines (not its imports)."""

    pool: descriptor_pool.DescriptorPool
    own_files: frozenset[str]
    source: str


@dataclass
class Counts:
    messages: int
    fields: int
    reachable_messages: int
    reachable_fields: int
    reachable_bytes_fields: int


@dataclass
class Comparison:
    """What ``theirs`` has that ``ours`` lacks, walking both from the same roots."""

    bytes_vs_message: list[tuple[str, str, str]] = field(default_factory=list)  # (ours msg, field, their type)
    missing_fields: list[tuple[str, int, str, str]] = field(default_factory=list)  # (ours msg, no, name, type)
    missing_messages: list[str] = field(default_factory=list)  # their types with no counterpart here
    conflicts: list[tuple[str, int, str, str]] = field(default_factory=list)  # (ours msg, no, ours, theirs)


def _proto_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    files: list[Path] = []
    includes: list[Path] = []
    for p in paths:
        path = Path(p).resolve()
        if path.is_dir():
            files += sorted(path.rglob("*.proto"))
            includes.append(path)
        elif path.is_file():
            files.append(path)
            includes.append(path.parent)
        else:
            raise SystemExit(f"overlay_coverage: {path}: no such .proto file or folder")
    if not files:
        raise SystemExit(f"overlay_coverage: no .proto files in {', '.join(map(str, paths))}")
    return files, includes


def load(paths: Sequence[str | Path] = ()) -> Schema:
    """The built-in overlay (no paths) or the schema in the given files/folders, compiled."""
    if paths:
        files, includes = _proto_files(paths)
        fds = compile_protos(files, includes)
        rel = set()
        for f in files:
            for inc in includes:
                if f.is_relative_to(inc):
                    rel.add(str(f.relative_to(inc)))
        source = ", ".join(map(str, paths))
    else:
        fds = compile_protos([PROTO_ROOT / f for f in BUILTIN_FILES], [PROTO_ROOT])
        rel = set(BUILTIN_FILES)
        source = "built-in overlay"
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    own = frozenset(fd.name for fd in fds.file if fd.name in rel)
    return Schema(pool, own, source)


def _find(pool: descriptor_pool.DescriptorPool, name: str) -> Descriptor | None:
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        return None


def _own_messages(schema: Schema) -> list[Descriptor]:
    out: list[Descriptor] = []

    def walk(d: Descriptor) -> None:
        if not d.GetOptions().map_entry:
            out.append(d)
        for n in d.nested_types:
            walk(n)

    for name in schema.own_files:
        for d in schema.pool.FindFileByName(name).message_types_by_name.values():
            walk(d)
    return out


def reachable(schema: Schema, roots: Sequence[str] = ROOTS) -> dict[str, Descriptor]:
    """Messages reachable from the roots through message fields (map entries and google.* excluded)."""
    seen: dict[str, Descriptor] = {}
    visited: set[str] = set()
    queue = deque(d for d in (_find(schema.pool, r) for r in roots) if d is not None)
    while queue:
        d = queue.popleft()
        if d.full_name in visited:
            continue
        visited.add(d.full_name)
        if not d.GetOptions().map_entry and not d.full_name.startswith("google."):
            seen[d.full_name] = d
        for f in d.fields:
            if f.message_type is not None:
                queue.append(f.message_type)
    return seen


def bytes_fields(schema: Schema, roots: Sequence[str] = ROOTS) -> list[str]:
    """``Message.field`` of every reachable field typed ``bytes`` (map values as ``Message.field[]``)."""
    out: list[str] = []
    for name, d in sorted(reachable(schema, roots).items()):
        for f in d.fields:
            if f.type == FieldDescriptor.TYPE_BYTES:
                out.append(f"{name}.{f.name}")
            elif f.message_type is not None and f.message_type.GetOptions().map_entry:
                v = f.message_type.fields_by_name["value"]
                if v.type == FieldDescriptor.TYPE_BYTES:
                    out.append(f"{name}.{f.name}[]")
    return out


def counts(schema: Schema, roots: Sequence[str] = ROOTS) -> Counts:
    own = _own_messages(schema)
    reach = reachable(schema, roots)
    return Counts(
        messages=len(own),
        fields=sum(len(d.fields) for d in own),
        reachable_messages=len(reach),
        reachable_fields=sum(len(d.fields) for d in reach.values()),
        reachable_bytes_fields=len(bytes_fields(schema, roots)),
    )


def _type(f: FieldDescriptor) -> str:
    if f.message_type is not None:
        return f.message_type.full_name
    if f.enum_type is not None:
        return "enum"
    return _TYPE_NAMES.get(f.type, str(f.type))


def _same_type(a: FieldDescriptor, b: FieldDescriptor) -> bool:
    ints = {"int32", "enum"}
    ta, tb = _type(a), _type(b)
    if ta == tb or {ta, tb} <= ints:
        return True
    # message types line up by structure (walked in parallel), not by name
    return a.message_type is not None and b.message_type is not None


def compare(ours: Schema, theirs: Schema, roots: Sequence[str] = ROOTS) -> Comparison:
    """Walk both schemas from the roots in parallel, pairing message types by field number."""
    cmp = Comparison()
    pairs: set[tuple[str, str]] = set()
    counterpart: set[str] = set()
    queue: deque[tuple[Descriptor, Descriptor]] = deque()
    for r in roots:
        a, b = _find(ours.pool, r), _find(theirs.pool, r)
        if a is not None and b is not None:
            queue.append((a, b))
    while queue:
        a, b = queue.popleft()
        if (a.full_name, b.full_name) in pairs:
            continue
        pairs.add((a.full_name, b.full_name))
        counterpart.add(b.full_name)
        ours_by_no = {f.number: f for f in a.fields}
        for g in b.fields:
            f = ours_by_no.get(g.number)
            if f is None:
                cmp.missing_fields.append((a.full_name, g.number, g.name, _type(g)))
                continue
            if f.type == FieldDescriptor.TYPE_BYTES and g.message_type is not None:
                cmp.bytes_vs_message.append((a.full_name, f.name, g.message_type.full_name))
            elif f.name != g.name or not _same_type(f, g):
                cmp.conflicts.append((a.full_name, f.number, f"{f.name}: {_type(f)}", f"{g.name}: {_type(g)}"))
            if f.message_type is not None and g.message_type is not None:
                fa, gb = f.message_type, g.message_type
                if fa.GetOptions().map_entry and gb.GetOptions().map_entry:
                    fa, gb = fa.fields_by_name["value"].message_type, gb.fields_by_name["value"].message_type
                    if fa is None or gb is None:
                        if gb is not None and fa is None:
                            cmp.bytes_vs_message.append((a.full_name, f.name + "[]", gb.full_name))
                        continue
                if not gb.full_name.startswith("google."):
                    queue.append((fa, gb))
    theirs_reach = reachable(theirs, roots)
    cmp.missing_messages = sorted(n for n in theirs_reach if n not in counterpart)
    return cmp


def kinds(schema: Schema) -> list[str]:
    """Dotted oneof kinds under the two envelopes (``top`` or ``top.member``), as the classifier names them."""
    out: list[str] = []
    for env in _ENVELOPES:
        d = _find(schema.pool, env)
        if d is None:
            continue
        for f in _real_oneof_fields(d):
            sub = _real_oneof_fields(f.message_type) if f.message_type is not None else []
            out += [f"{f.name}.{m.name}" for m in sub] if sub else [f.name]
    return sorted(set(out))


def _real_oneof_fields(d: Descriptor) -> list[FieldDescriptor]:
    for o in d.oneofs:
        if len(o.fields) == 1 and o.name == "_" + o.fields[0].name:
            continue
        return list(o.fields)
    return []


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--schema", nargs="*", default=[], help="count this schema instead of the built-in overlay")
    ap.add_argument("--against", nargs="*", default=[], help="list what this schema has that ours lacks")
    ap.add_argument("--kinds", action="store_true", help="print the oneof kinds under the two envelopes")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    ours = load(args.schema)
    report: dict[str, object] = {"schema": ours.source, "counts": asdict(counts(ours))}
    if args.kinds:
        report["kinds"] = kinds(ours)
    if args.against:
        theirs = load(args.against)
        cmp = compare(ours, theirs)
        report["against"] = {"schema": theirs.source, "counts": asdict(counts(theirs)), **asdict(cmp)}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    c = report["counts"]
    assert isinstance(c, dict)
    print(f"{ours.source}: {c['messages']} messages, {c['fields']} fields; reachable from the roots: "
          f"{c['reachable_messages']} messages, {c['reachable_fields']} fields, "
          f"{c['reachable_bytes_fields']} of them bytes")
    if args.kinds:
        kinds_list = report["kinds"]
        assert isinstance(kinds_list, list)
        print(f"kinds ({len(kinds_list)}): " + " ".join(kinds_list))
    if args.against:
        theirs_report = report["against"]
        assert isinstance(theirs_report, dict)
        tc = theirs_report["counts"]
        print(f"against {theirs_report['schema']}: {tc['messages']} messages, {tc['fields']} fields; "
              f"reachable {tc['reachable_messages']} messages")
        for title, key in (("bytes here, a message there", "bytes_vs_message"),
                           ("field numbers only there", "missing_fields"),
                           ("messages only there", "missing_messages"),
                           ("name/type disagreements", "conflicts")):
            rows = theirs_report[key]
            assert isinstance(rows, list)
            print(f"\n{title}: {len(rows)}")
            for row in rows:
                print("  " + (" ".join(map(str, row)) if isinstance(row, list | tuple) else str(row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``workbench schema use | show | diff | drift``: arguments and printing (the work is in
``active.py``, ``diff.py`` and ``drift.py``).

Exit status: ``use``, ``show`` and ``drift`` 0 on success; ``diff`` 0 when the schemas are the
same, 1 when they differ; every command 2 on an error (a missing or unusable schema, a missing or
damaged database), with a message naming the file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from workbench.commands.common import add_db_arg, add_json_arg, reader_from
from workbench.errors import CliError
from workbench.schema.active import BUILTIN, active_schema, choose, config_path, reset, schema_of, use
from workbench.schema.diff import change_line, counts, diff, load_side
from workbench.schema.loader import Schema


def register(ssub: Any) -> None:
    u = ssub.add_parser(
        "use", help="make a schema the default for decode, import, capture, the TUI and analysis",
        description="Make PATH (a folder of .proto files such as `schema extract` writes, a .proto file, a "
                    "descriptor set, or several of them) the schema every decoding command uses unless it is "
                    "given --proto. The schema is checked first, then copied (self-contained, named by its "
                    "hash) into the workbench config folder ($XDG_CONFIG_HOME/workbench, else "
                    "~/.config/workbench); --link records the paths instead. --reset goes back to the "
                    "built-in overlay.")
    u.add_argument("paths", nargs="*", metavar="PATH", help="schema folder, .proto file or descriptor set")
    u.add_argument("--link", action="store_true", help="refer to PATH where it is instead of keeping a copy")
    u.add_argument("--reset", action="store_true", help="go back to the built-in overlay")
    add_json_arg(u, "print the result as JSON")
    u.set_defaults(func=_use)

    s = ssub.add_parser("show", help="which schema is active, and where that is configured",
                        description="Print the schema decoding commands use now: its identity (hash, source, "
                                    "message count) and why it is active (--proto, `schema use`, or the built-in "
                                    "overlay).")
    s.add_argument("--proto", action="append", default=[], metavar="PATH",
                   help="show what this --proto would make active instead")
    add_json_arg(s, "print as JSON")
    s.set_defaults(func=_show)

    d = ssub.add_parser("diff", help="what changed between two schemas (exit 0 same, 1 different, 2 error)",
                        description="Compare two schemas (folders, .proto files, descriptor sets, or `builtin` for "
                                    "the built-in overlay): messages, enums and services added or removed; fields "
                                    "added, removed, renamed, renumbered, retyped; oneof members added or removed; "
                                    "enum values. Exit 0 when they are the same, 1 when they differ, 2 on error.")
    d.add_argument("a", metavar="A", help="the older schema (or `builtin`)")
    d.add_argument("b", metavar="B", help="the newer schema (or `builtin`)")
    add_json_arg(d, "print the changes as JSON")
    d.set_defaults(func=_diff)

    r = ssub.add_parser("drift", help="field paths the captures carry that a schema does not name",
                        description="Read every protobuf frame of the database with the active schema (or "
                                    "--base) and list each field path that decodes as an unknown field (numbered "
                                    "frame kinds included), opaque bytes or an unknown message type: counts, "
                                    "sessions, first/last seen, client versions, an example. With --proto, also "
                                    "whether that schema (e.g. a newly extracted one) names each path.")
    add_db_arg(r)
    r.add_argument("--proto", action="append", default=[], metavar="PATH",
                   help="check whether this schema names each path (repeatable, as for decode)")
    r.add_argument("--base", action="append", default=[], metavar="PATH",
                   help="read the captures with this schema instead of the active one (`builtin`: the overlay)")
    r.add_argument("--sample", type=int, default=None, metavar="N",
                   help="walk at most N frames of each kind (numbered kinds are still counted exactly)")
    add_json_arg(r, "print the report as JSON")
    r.set_defaults(func=_drift)


def _identity(schema: Schema) -> dict[str, Any]:
    return schema.identity.as_dict()


# use / show ----------------------------------------------------------------------------------

def _use(args: argparse.Namespace) -> int:
    if args.paths == [BUILTIN]:  # `schema use builtin` is a reset
        args.reset, args.paths = True, []
    if args.reset:
        if args.paths or args.link:
            raise CliError("--reset takes no PATH (and no --link)")
        had = reset()
        if args.json:
            print(json.dumps({"reset": had, "config": str(config_path())}))
        else:
            print(f"back to the built-in overlay ({'removed ' + str(config_path()) if had else 'nothing was set'})")
        return 0
    if not args.paths:
        raise CliError("give a schema PATH (folder, .proto file or descriptor set), or --reset")
    choice, schema = use(args.paths, link=args.link)
    if args.json:
        print(json.dumps(_show_doc(choice, schema), indent=1))
        return 0
    kept = (f"copied to {choice.paths[0]}" if choice.copied_from else "linked (not copied)")
    print(f"now active: {schema.identity.source}: hash {schema.identity.hash}, {schema.identity.messages} messages "
          f"({schema.identity.user_messages} from this schema, {schema.identity.replaced} built-in types replaced)")
    print(f"  {kept}; recorded in {choice.config}")
    print("  decode, import, capture, tui and frames --json use it unless given --proto; "
          "undo with 'workbench schema use --reset'")
    for note in schema.notes:
        print(f"  note: {note}")
    return 0


def _show_doc(choice: Any, schema: Schema) -> dict[str, Any]:
    return {"via": choice.via, "config": choice.config, "paths": list(choice.paths),
            "copied_from": list(choice.copied_from) if choice.copied_from else None,
            "identity": _identity(schema), "notes": schema.notes}


def _show(args: argparse.Namespace) -> int:
    choice = choose(args.proto)
    schema = schema_of(choice)
    if args.json:
        print(json.dumps(_show_doc(choice, schema), indent=1))
        return 0
    ident = schema.identity
    print(f"active schema: {ident.source}")
    if choice.via == "schema use":
        how = f"copy in {choice.paths[0]}" if choice.copied_from else "linked"
        print(f"  set by: workbench schema use ({how}), recorded in {choice.config}")
    elif choice.via == "--proto":
        print("  set by: --proto (this command only)")
    else:
        print(f"  set by: nothing configured ({config_path()} does not exist): the built-in overlay")
    print(f"  hash: {ident.hash}")
    extra = (f" ({ident.user_messages} from this schema, {ident.replaced} built-in types replaced)"
             if ident.user_messages else "")
    print(f"  messages: {ident.messages}{extra}, enums: {ident.enums}, services: {ident.services}")
    for note in schema.notes:
        print(f"  note: {note}")
    return 0


# diff ----------------------------------------------------------------------------------------

def _diff(args: argparse.Namespace) -> int:
    a, b = load_side(args.a), load_side(args.b)
    changes = diff(a.files, b.files)
    if args.json:
        print(json.dumps({"a": a.identity(), "b": b.identity(), "same": not changes, "counts": counts(changes),
                          "changes": [c.as_dict() for c in changes]}, indent=1, default=str))
        return 1 if changes else 0
    for label, side in (("A", a), ("B", b)):
        ident = side.identity()
        print(f"{label}: {ident['source']} (hash {ident['hash']}, {ident['messages']} messages, "
              f"{ident['enums']} enums, {ident['services']} services)")
    if not changes:
        print("same: no message, field, enum or service differs")
        return 0
    current = None
    for c in changes:
        whole = c.change.endswith(("_added", "_removed")) and c.field is None
        if whole:
            print(change_line(c))
            current = None
            continue
        if c.type != current:
            print(f"~ {c.type}")
            current = c.type
        print("    " + change_line(c))
    summary = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in counts(changes).items())
    print(f"{len(changes)} changes: {summary}")
    return 1


# drift ---------------------------------------------------------------------------------------

def _drift(args: argparse.Namespace) -> int:
    # deferred: only drift reads a database (duckdb, pyarrow); use, show and diff need neither
    from workbench.analysis.schema_drift import drift
    from workbench.store.live import sidecar_path

    if args.sample is not None and args.sample < 1:
        raise CliError(f"--sample must be at least 1, not {args.sample}")
    if not Path(args.db).exists() and not sidecar_path(args.db).exists():
        raise CliError(f"--db {args.db}: no such capture database")
    base = active_schema(args.base)
    against = active_schema(args.proto) if args.proto else None
    reader = reader_from(args)
    try:
        rep = drift(reader, base, against=against, sample=args.sample)
    finally:
        reader.close()
    doc = {"db": args.db, "base": _identity(base), "against": _identity(against) if against else None,
           "frames_total": rep.frames_total, "frames_walked": rep.frames_walked, "sample": rep.sample,
           "recorded_with": rep.recorded_with, "paths": [p.as_dict() for p in rep.paths]}
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
        return 0
    _print_drift(doc)
    return 0


def _print_drift(doc: dict[str, Any]) -> None:
    base = doc["base"]
    print(f"drift in {doc['db']}, read with {base['source']} (hash {base['hash']}, {base['messages']} messages)")
    rec = "; ".join(f"{r['source'] or '(not recorded)'}"
                    + (f" (hash {r['hash']}, {r['messages']} messages)" if r["hash"] else "")
                    + f": {r['sessions']} session{'s' if r['sessions'] != 1 else ''}" for r in doc["recorded_with"])
    print(f"captures decoded with: {rec or '(no sessions)'}")
    sampled = f" (at most {doc['sample']} per kind)" if doc["sample"] else ""
    paths = doc["paths"]
    print(f"walked {doc['frames_walked']:,} of {doc['frames_total']:,} protobuf frames{sampled}; "
          f"{len(paths)} path{'s' if len(paths) != 1 else ''} the schema does not name")
    other = doc["against"]
    if other:
        named = sum(1 for p in paths if p["named_by_other"])
        print(f"checked against {other['source']} (hash {other['hash']}): it names {named} of {len(paths)}")
    for p in paths:
        where = f"{p['owner']} field {p['numbers'][-1]}" if p["owner"] and p["numbers"] else p["msg_type"]
        print(f"\n{p['path']}   {p['what']} ({where})")
        versions = ", ".join(p["client_versions"]) or "unknown"
        print(f"    {p['frames']} frame{'s' if p['frames'] != 1 else ''} in {p['sessions']} "
              f"session{'s' if p['sessions'] != 1 else ''}, {p['first_seen']} → {p['last_seen']}, "
              f"client {versions}")
        if p["example"] is not None and p["example_at"]:
            at = p["example_at"]
            print(f"    example (session {at['session_id'][:12]}, seq {at['seq']}): {p['example']}")
        if other:
            n = p["named_by_other"]
            print(f"    --proto: {n['name']} ({n['type']}) in {n['owner']}" if n and n.get("owner")
                  else (f"    --proto: {n['name']}" if n else "    --proto: not named there either"))

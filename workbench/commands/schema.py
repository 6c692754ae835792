"""``workbench schema …``: extract a schema from protobuf-es generated JavaScript, make one the default
(``use``, ``show``), compare two (``diff``) and find what the captures carry that a schema does not
name (``drift``). The work is done in ``extract/``, ``active.py``, ``diff.py`` and ``drift.py``;
this module parses arguments and prints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.commands import schema_choice
from workbench.commands.common import add_json_arg
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.schema.extract import ExtractError, extract, report, write
from workbench.textsafe import escape_display

DEFAULT_OUT = "extracted_schema"
_SHOW_PROBLEMS = 20


def register(sub: Any) -> None:
    p = add_command(sub, "schema")
    ssub = p.add_subparsers(dest="schema_command", metavar="SUBCOMMAND")
    e = ssub.add_parser("extract", help="recover .proto files from protobuf-es generated JavaScript",
                        description="Read .js/.mjs/.cjs files or folders (minified or not, ESM or CommonJS, one "
                                    "bundle or many chunks) and recover the protobuf-es v1 and v2 schema they "
                                    "carry. Writes .proto files plus report.json into DIR and/or a "
                                    "FileDescriptorSet. Exit 2 when nothing at all was recovered.")
    e.add_argument("paths", nargs="+", metavar="PATH", help="JavaScript file or folder (repeatable)")
    e.add_argument("-o", "--out", metavar="DIR", default=None,
                   help=f"folder for the .proto files and report.json (default ./{DEFAULT_OUT} unless only "
                        "--descriptor-set is given)")
    e.add_argument("--descriptor-set", metavar="FILE", type=Path, default=None,
                   help="also write a FileDescriptorSet (self-contained; usable with --proto FILE)")
    add_json_arg(e, "print the report as JSON instead of text")
    e.set_defaults(func=_extract)
    schema_choice.register(ssub)

    def usage(args: argparse.Namespace) -> int:  # `workbench schema` with no subcommand
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def _extract(args: argparse.Namespace) -> int:
    try:
        ex = extract(args.paths)
    except ExtractError as exc:
        raise CliError(str(exc)) from exc
    out = Path(args.out) if args.out else (None if args.descriptor_set else Path(DEFAULT_OUT))
    written = write(ex, out, args.descriptor_set) if ex.files else []
    rep = report(ex)
    if args.json:
        print(json.dumps({**rep, "written": [str(p) for p in written]}, indent=1))
    else:
        _print_text(rep, written)
    if not ex.files:
        print(escape_display("workbench schema extract: nothing recovered from " + ", ".join(args.paths)
                             + (f" ({ex.problems[0]})" if ex.problems else "")), file=sys.stderr)
        return 2
    return 0


def _print_text(rep: dict[str, Any], written: list[Path]) -> None:
    c = rep["counts"]
    print(f"recovered {c['messages']} messages, {c['enums']} enums, {c['services']} services, "
          f"{c['fields']} fields in {c['files']} files")
    for inp in rep["inputs"]:
        print(f"  {inp['file']}: {inp['bytes']} bytes, {inp['definitions']} definitions")
    for pkg, n in sorted(rep["packages"].items()):
        print(f"  package {pkg}: {n['messages']} messages, {n['enums']} enums, {n['services']} services")
    problems = rep["problems"]
    if problems:
        print(f"{len(problems)} problems (all in report.json):")
        for p in problems[:_SHOW_PROBLEMS]:
            where = p["file"] + (f": offset {p['offset']}" if p["offset"] is not None else "")
            print(escape_display(f"  {where}: {p['problem']}"))  # a bundle's text: workbench.textsafe
        if len(problems) > _SHOW_PROBLEMS:
            print(f"  … and {len(problems) - _SHOW_PROBLEMS} more")
    for path in written:
        print(f"wrote {path}")

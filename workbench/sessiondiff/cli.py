"""``workbench diff A B``: compare two recorded sessions; exit 1 when they differ (for CI)."""

from __future__ import annotations

import argparse
import sys

from workbench.commands.common import add_db_arg, add_json_arg
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.textsafe import escape_display, escape_json


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "diff")
    p.add_argument("a", metavar="A", help="a session id (or unique prefix) in --db, or a replay fixture file")
    p.add_argument("b", metavar="B", help="the session to compare with: an id or prefix in --db-b (default --db), "
                                          "or a fixture file")
    add_db_arg(p)
    p.add_argument("--db-b", metavar="PATH", help="capture database of B when it is not --db")
    add_json_arg(p, "one JSON document instead of text")
    p.add_argument("--timing-threshold", type=float, default=0.5, metavar="SECONDS",
                   help="report a step whose delay after the previous frame differs by more than this (default 0.5)")
    p.add_argument("--compare-ids", action="store_true", help="compare ids, hashes and times too")
    p.add_argument("--client-heartbeats", action="store_true",
                   help="align the client's keep-alives too (left out by default: they follow the clock)")
    p.add_argument("--redact", choices=["secrets", "content"], default="secrets",
                   help="'content' also hides prompts, file contents and tool arguments in what is shown")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    # deferred: the command registry imports this module for `--help`; DuckDB and the decoder load on use
    from workbench.report.session import load_session, open_source
    from workbench.sessiondiff.compare import Options, diff_sessions
    from workbench.sessiondiff.render import dumps, human

    if args.timing_threshold < 0:
        raise CliError(f"--timing-threshold {args.timing_threshold}: must be 0 or more seconds")
    opts = Options(timing_threshold_s=args.timing_threshold, compare_ids=args.compare_ids,
                   client_heartbeats=args.client_heartbeats)
    with open_source(args.a, args.db) as (src_a, sid_a):
        a = load_session(src_a, sid_a, redact=args.redact)
    with open_source(args.b, args.db_b or args.db) as (src_b, sid_b):
        b = load_session(src_b, sid_b, redact=args.redact)
    d = diff_sessions(a, b, opts)
    # the output boundary: both sessions' text through the printer (workbench.textsafe); JSON stays exact
    print(escape_json(dumps(d)) if args.json else escape_display(human(d), layout=True), file=sys.stdout)
    return 0 if d.same else 1

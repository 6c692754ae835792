"""``workbench diagnose``, ``workbench blobs``, ``workbench tools``.

``diagnose`` exits 0 when no session has a warning or error finding and 1 otherwise, so a CI job
can gate on it; usage errors exit 2 (raised as CliError). Findings are written back to the
database when this process can open it for writing; through a live capture's read service (or a
file another process holds) the report is printed and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TypedDict

from workbench.analysis.argsdiff import args_diff
from workbench.analysis.bridge import format_ttft, ttft_split
from workbench.analysis.bridge_join import has_bridge_sessions, links_of
from workbench.analysis.conversations import Conversations
from workbench.analysis.engine import analyze_session, write_results
from workbench.analysis.model import AnalysisResult, Config, FindingJson
from workbench.analysis.report import print_report
from workbench.commands.common import add_db_arg, add_json_arg, resolve_session
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.protocol.args import parse_json
from workbench.store import analysis_reads as reads
from workbench.store.db import Store, StoreError
from workbench.store.reader import live_pid, open_reader
from workbench.textsafe import block_stream, escape, escape_display


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "diagnose")
    p.add_argument("session", nargs="?", help="session id (a unique prefix is enough)")
    p.add_argument("--all", action="store_true", help="every session in the database")
    add_json_arg(p, "one JSON object per session")
    p.add_argument("--no-write", action="store_true", help="do not write findings back to the database")
    p.add_argument("--heartbeats", type=int, default=Config.heartbeat_min_count, metavar="N",
                   help=f"heartbeat_loop: at least N consecutive server heartbeats (default {Config.heartbeat_min_count})")
    p.add_argument("--heartbeat-span", type=float, default=Config.heartbeat_min_span_s, metavar="SECONDS",
                   help="heartbeat_loop: the stretch lasts at least this long (default 0)")
    p.add_argument("--tool-repeats", type=int, default=Config.tool_loop_min_repeats, metavar="N",
                   help=f"tool_loop: same call N times in a row (default {Config.tool_loop_min_repeats})")
    add_db_arg(p)
    p.set_defaults(func=cmd_diagnose)

    p = add_command(sub, "blobs")
    p.add_argument("session", help="session id (a unique prefix is enough)")
    add_json_arg(p, "one JSON object per blob request")
    add_db_arg(p)
    p.set_defaults(func=cmd_blobs)

    p = add_command(sub, "tools")
    p.add_argument("session", help="session id (a unique prefix is enough)")
    add_json_arg(p, "one JSON object per tool call")
    add_db_arg(p)
    p.set_defaults(func=cmd_tools)


def _check_db(path: str) -> None:
    if not Path(path).exists():
        raise CliError(f"--db {path}: no such capture database")


def _writable_store(path: str) -> Store | None:
    """The database opened for writing, or None when a capture (or anyone) holds it."""
    if live_pid(path) is not None:  # a capture proved to hold it (a stale sidecar does not)
        return None
    try:
        return Store(path)
    except StoreError:
        return None


def cmd_diagnose(args: argparse.Namespace) -> int:
    if args.all and args.session:
        raise CliError("give either a SESSION or --all, not both")
    if not args.all and not args.session:
        raise CliError("give a SESSION id (or prefix) or --all")
    if args.heartbeats < 1 or args.tool_repeats < 2 or args.heartbeat_span < 0:
        raise CliError("--heartbeats must be >= 1, --tool-repeats >= 2 and --heartbeat-span >= 0")
    cfg = Config(heartbeat_min_count=args.heartbeats, heartbeat_min_span_s=args.heartbeat_span,
                 tool_loop_min_repeats=args.tool_repeats)
    _check_db(args.db)
    store = None if args.no_write else _writable_store(args.db)
    src: Any = store if store is not None else open_reader(args.db)
    try:
        if args.all:
            ids = reads.session_ids(src)
        else:
            ids = [resolve_session(src, args.session)]
        convs = Conversations(src)  # each session's siblings read once for all of them
        results = [analyze_session(src, sid, cfg, conversations=convs) for sid in ids]
        note = None
        if store is not None:
            write_results(store, results)
        elif not args.no_write:
            note = (f"note: findings not written: {args.db} is held by another process (a capture in progress?); "
                    "this report was read through its live reader")
        bridge = _bridge_facts(src, ids)
        if args.json:
            for r in results:
                print(json.dumps({**result_json(r), **bridge.get(r.session_id, {"links": []})}, default=str))
        else:
            # findings quote the capture (tool names, ids, messages): written through the printer,
            # which keeps the report's own lines and escapes any control character (workbench.textsafe)
            out = block_stream(sys.stdout)
            print_report(results, file=out)
            for sid, facts in bridge.items():
                print(f"bridge: session {sid[:8]} ↔ " + ", ".join(
                    f"{lk['session_id'][:8]} ({lk['role']}, by {'+'.join(lk['by'])})" for lk in facts["links"]),
                      file=out)
                if facts.get("ttft"):
                    print(f"        {format_ttft(facts['ttft'])}", file=out)
            if note:
                print(note, file=out)
    finally:
        src.close()
    return 1 if any(r.failed for r in results) else 0


def _bridge_facts(src: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
    """session id → its bridge links (and, for an OpenAI request, where its first token's time went)."""
    out: dict[str, dict[str, Any]] = {}
    if not has_bridge_sessions(src):
        return out
    for sid in ids:
        links = links_of(src, sid)
        if links:
            out[sid] = {"links": [lk.as_dict() for lk in links], "ttft": ttft_split(src, sid)}
    return out


class ResultJson(TypedDict):
    """One line of ``diagnose --json`` (keys in this order: scripts read them)."""

    session_id: str
    frames: int
    failed: bool
    findings: list[FindingJson]
    notes: list[FindingJson]


def result_json(r: AnalysisResult) -> ResultJson:
    """The session's findings (errors, warnings), then its notes (``"severity": "note"``) in a list of
    their own: a consumer that gates on ``findings == []`` is not tripped by what did no harm."""
    return {"session_id": r.session_id, "frames": r.frame_count, "failed": r.failed,
            "findings": [f.to_json() for f in r.problems], "notes": [f.to_json() for f in r.notes]}


def _load(args: argparse.Namespace) -> AnalysisResult:
    _check_db(args.db)
    reader = open_reader(args.db)
    try:
        sid = resolve_session(reader, args.session)
        return analyze_session(reader, sid)
    finally:
        reader.close()


def _short(value: Any, width: int) -> str:
    if value is None:
        return ""
    # one line, control characters as visible escapes (workbench.textsafe); JSON has its own
    # escapes already (display form: its backslashes are not doubled)
    text = escape(value) if isinstance(value, str) else escape_display(
        json.dumps(value, default=str, sort_keys=True))
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_blobs(args: argparse.Namespace) -> int:
    r = _load(args)
    if args.json:
        for b in r.blobs:
            row = {k: v for k, v in b.items() if k != "data"}
            print(json.dumps(row, default=str))
        return 0
    print(f"session {escape(r.session_id)}: {len(r.blobs)} blob request(s)")
    print(f"{'seq':>6} {'kv':>4} {'op':4} {'status':10} {'blob_id':14} {'size':>7} {'type':36} {'sha':4} "
          f"{'checkpoint_ref':30} preview")
    for b in r.blobs:
        kind = b["content_type"] or ""
        if b.get("role"):
            kind += f"/{b['role']}"
        elif b.get("proto_type"):
            kind += f"/{b['proto_type']}"
        sha = "" if b["sha256_ok"] is None else ("ok" if b["sha256_ok"] else "no")
        print(f"{b['seq'] if b['seq'] is not None else '':>6} {b['kv_id'] if b['kv_id'] is not None else '':>4} "
              f"{escape(b['op']):4} {escape(b['status']):10} {escape(b['blob_id'][:12]) + '…':14} "
              f"{b['size'] if b['size'] is not None else '':>7} {_short(kind, 36):36} {sha:4} "
              f"{_short(b.get('checkpoint_ref'), 30):30} {_short(b.get('preview'), 80)}")
    return 0


def cmd_tools(args: argparse.Namespace) -> int:
    r = _load(args)
    if args.json:
        for t in r.tool_calls:
            diff = args_diff(t["args_merged"], t["args_completion"])
            print(json.dumps({**t, "completion_diff": diff.as_dict() if diff else None}, default=str))
        return 0
    print(f"session {escape(r.session_id)}: {len(r.tool_calls)} tool call(s)")
    for t in r.tool_calls:
        exec_part = f" exec {t['exec_id']} seq {t['exec_seq']}" if t["exec_id"] is not None else ""
        result_part = f" result seq {t['result_seq']}" if t["result_seq"] is not None else ""
        # call ids and tool names come from the capture: one line each, control characters escaped
        print(f"{escape(t['call_id'])}  {escape(t['tool_name'])}  {escape(t['status'])}  "
              f"seq {t['first_seq']}–{t['last_seq']}"
              f"{exec_part}{result_part}")
        print(f"    merged:     {_short(t['args_merged'], 150)}")
        if t["args_streamed"] is not None and t["args_streamed"] != t["args_merged"]:
            print(f"    streamed:   {_short(t['args_streamed'], 150)}")
        if t["args_completion"] is not None and t["args_completion"] != t["args_merged"]:
            print(f"    completion: {_short(t['args_completion'], 150)}")
            diff = args_diff(t["args_merged"], t["args_completion"])
            if diff:
                # the difference in words: the truncated objects alone hide which key went or changed type
                print(f"    completion vs merged: {escape_display(diff.describe())}")
        if t["args_naive"] is not None and parse_json(t["args_naive"]) != t["args_streamed"]:
            print(f"    naive:      {_short(t['args_naive'], 150)}  (what concatenating the deltas gives)")
        if t["result"] is not None:
            print(f"    result:     {_short(t['result'], 150)}")
    return 0

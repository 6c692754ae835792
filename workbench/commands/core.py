"""Core commands: decode, sessions, frames, sql."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.commands.common import (
    add_db_arg,
    add_json_arg,
    add_proto_arg,
    decoder_from,
    print_rows,
    print_table,
    reader_from,
    resolve_session,
    table_rows,
)
from workbench.commands.table import add_command
from workbench.decode.frame import DIRECTIONS, TRANSPORTS
from workbench.errors import CliError
from workbench.overview import finding_states, query_top_findings
from workbench.store.limits import DEFAULT_MAX_RESULT_BYTES, DEFAULT_TIMEOUT_S
from workbench.store.queries import (
    SESSION_LIST_COLUMNS,
    Reader,
    Row,
    frames_after,
    session_list,
    session_status,
)
from workbench.textsafe import escape, escape_display, escape_json, json_stream

if TYPE_CHECKING:
    from workbench.decode.classify import Decoder, Frame

MIB = 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "decode")
    p.add_argument("hex", nargs="?", help="hex bytes (whitespace allowed); omit to read --file or stdin")
    p.add_argument("--file", "-f", help="read raw bytes from this file ('-' = stdin as raw bytes)")
    p.add_argument("--direction", choices=DIRECTIONS, default="server",
                   help="server = server→client (default), client = client→server")
    p.add_argument("--transport", choices=TRANSPORTS, default="run",
                   help="how the bytes travelled: run (default), runsse, runpoll (enveloped frames), "
                        "bidi_append (a BidiAppend request body), unary")
    add_json_arg(p, "print JSON objects with kind, summary, fields")
    p.add_argument("--batch", action="store_true",
                   help='read NDJSON lines {"hex", "direction", "transport"} (from the positional path, '
                   "--file, or stdin) and write one JSON result per line")
    add_proto_arg(p)
    p.set_defaults(func=cmd_decode)

    p = add_command(sub, "sessions")
    add_db_arg(p)
    add_json_arg(p, "one JSON object per session (id, status, label, times, counts, top_finding and "
                   "top_finding_message)")
    p.set_defaults(func=cmd_sessions)

    p = add_command(sub, "frames")
    p.add_argument("session", help="session id (a unique prefix is enough)")
    add_db_arg(p)
    p.add_argument("--kind", action="append", default=[],
                   help="only kinds starting with this (repeatable), e.g. interaction_update.text_delta")
    p.add_argument("--direction", choices=DIRECTIONS,
                   help="only frames sent this way: server (server→client) or client (client→server)")
    p.add_argument("--limit", type=int, default=0, help="at most N frames (0 = all)")
    p.add_argument("--from", dest="from_seq", type=int, default=None, metavar="SEQ",
                   help="start at this seq (a report names where the frames it leaves out begin)")
    add_json_arg(p, "one JSON object per line, with decoded fields")
    p.add_argument("--follow", action="store_true",
                   help="keep printing new frames while the capture is in progress (Ctrl-C to stop)")
    add_proto_arg(p)
    p.set_defaults(func=cmd_frames)

    p = add_command(sub, "sql")
    p.add_argument("query", help="one SELECT (or EXPLAIN [ANALYZE] SELECT …) statement")
    add_db_arg(p)
    add_json_arg(p, "one JSON object per row")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"interrupt the query after this long (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--max-result-mb", type=float, default=DEFAULT_MAX_RESULT_BYTES / MIB, metavar="MB",
                   help=f"refuse results larger than this many MiB of Arrow data "
                        f"(default {DEFAULT_MAX_RESULT_BYTES // MIB})")
    p.set_defaults(func=cmd_sql)


# decode ------------------------------------------------------------------------------------------

def _parse_hex(text: str, where: str) -> bytes:
    cleaned = "".join(text.split())
    if cleaned.startswith(("0x", "0X")):
        cleaned = cleaned[2:]
    try:
        return bytes.fromhex(cleaned)
    except ValueError as exc:
        raise CliError(f"{where}: not valid hex ({exc})") from exc


def _result(dec: Decoder, frames: list[Frame]) -> dict[str, Any]:
    from workbench.decode.render import frame_to_json  # named trees: only --json and --batch build them

    if not frames:
        return {"kind": "empty", "summary": "no bytes", "fields": {}}
    first = frame_to_json(dec, frames[0])
    if len(frames) > 1:
        first["more"] = [frame_to_json(dec, f) for f in frames[1:]]
    return first


def cmd_decode(args: argparse.Namespace) -> int:
    dec = decoder_from(args)
    if args.batch:
        return _decode_batch(args, dec)
    if args.hex is not None:
        data = _parse_hex(args.hex, "hex argument")
    elif args.file and args.file != "-":
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise CliError(f"{args.file}: {exc.strerror}") from exc
    else:
        raw = sys.stdin.buffer.read()
        data = raw if args.file == "-" else _parse_hex(raw.decode("ascii", "replace"), "stdin")
    frames = dec.decode_body(data, args.transport, args.direction)
    bad = 0
    for f in frames:
        if args.json:
            from workbench.decode.render import frame_to_json  # named trees: only --json builds them

            print(escape_json(json.dumps(frame_to_json(dec, f), ensure_ascii=False)))
        else:
            # what the bytes say is shown with its control characters escaped (workbench.textsafe)
            line = f"{escape(f.kind):48} {escape_display(f.summary)}"
            if f.error:
                line += f"  [error: {escape_display(f.error)}]"
            print(line)
        bad += f.kind == "malformed"
    return 1 if bad else 0


def _batch_lines(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    source = args.hex or args.file
    if source and source != "-":
        try:
            with open(source, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    yield f"{source}:{n}", line
        except OSError as exc:
            raise CliError(f"{source}: {exc.strerror}") from exc
    else:
        for n, line in enumerate(sys.stdin, 1):
            yield f"stdin:{n}", line


def _decode_batch(args: argparse.Namespace, dec: Decoder) -> int:
    failures = 0
    out = sys.stdout
    for where, line in _batch_lines(args):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict) or "hex" not in item:
                raise ValueError('expected an object with "hex"')
            direction = item.get("direction", args.direction)
            transport = item.get("transport", args.transport)
            if direction not in DIRECTIONS:
                raise ValueError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
            if transport not in TRANSPORTS:
                raise ValueError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
            data = bytes.fromhex("".join(str(item["hex"]).split()))
        except ValueError as exc:
            failures += 1
            result: dict[str, Any] = {"kind": "error", "summary": "bad input line", "fields": {},
                                      "error": f"{where}: {exc}"}
        else:
            result = _result(dec, dec.decode_body(data, transport, direction))
        out.write(escape_json(json.dumps(result, ensure_ascii=False)) + "\n")
    out.flush()
    return 1 if failures else 0


# sessions / frames / sql ----------------------------------------------------------------------

def cmd_sessions(args: argparse.Namespace) -> int:
    # deferred: the analysis package loads DuckDB, which `workbench decode` (this module) must not
    from workbench.analysis.bridge_join import listing_links

    reader = reader_from(args)
    try:
        listed = session_list(reader)
        statuses = {row["session_id"]: row["status"] for row in listed}
        states = finding_states(reader, statuses)
        # Findings are stored when a session ends; sessions an upgrade made stale (or that nobody
        # analysed, e.g. written by an older workbench) get theirs now, when the file is free.
        due = [sid for sid, st in states.items() if st.analysis in ("stale", "not analysed")]
        if due and not reader.live:
            # deferred: the analysis engine (protobuf, rules) loads only when a listing has sessions to refresh
            from workbench.analysis.stored import refresh_listing

            reader.close()
            stored = refresh_listing(args.db, due)
            reader = reader_from(args)
            if stored:
                print(f"workbench sessions: stored the findings of {len(stored)} session"
                      f"{'s' if len(stored) != 1 else ''} not analysed by this version", file=sys.stderr)
                states = finding_states(reader, statuses)
        # The top finding is the root cause (workbench.analysis.causes.order_findings), not the worst
        # symptom: it is what to look at first. Notes never count as findings.
        top = query_top_findings(reader)
        ids = [row["session_id"] for row in listed]
        links = listing_links(reader, ids)  # the other side of a bridge (docs/bridge.md)
    finally:
        reader.close()
    codes = [f.code if (f := top.get(sid)) is not None else None for sid in ids]
    if args.json:
        for row, code in zip(listed, codes, strict=True):  # times past year 9999 as text
            st = states[row["session_id"]]
            f = top.get(row["session_id"])
            row["findings"] = st.findings if st.analysed else None
            row["notes"] = st.notes if st.analysed else None
            row["analysis"] = st.analysis
            row["top_finding"] = code
            row["top_finding_message"] = (f.message or None) if f is not None else None
            row["links"] = [lk["session_id"] for lk in links.get(row["session_id"], [])]
            row["link_details"] = links.get(row["session_id"], [])
            print(json.dumps(row, default=str))
    else:
        extra: dict[str, Sequence[Any]] = {"findings": [states[s].text() for s in ids],
                 "notes": [str(states[s].notes) if states[s].notes else "" for s in ids], "top_finding": codes}
        if links:
            extra["links"] = [" ".join(f"{lk['session_id'][:8]}({lk['role']})" for lk in links.get(s, [])) for s in ids]
        print_rows(listed, SESSION_LIST_COLUMNS, extra=extra)
    return 0


# Reading a session never holds all its payloads: rows come in pages of at most this many rows and
# (with --json, which needs the payloads) this many payload bytes, a single larger frame alone.
PAGE_ROWS = 20_000
PAGE_BYTES = 64 * 1024 * 1024


def _frame_page(reader: Reader, args: argparse.Namespace, session_id: str, after: int, want: int) -> list[Row]:
    """The next page of matching frames after seq ``after`` (at most ``want`` rows)."""
    return frames_after(reader, session_id, after, want, direction=args.direction, kind_prefixes=args.kind or (),
                        payload_bytes=PAGE_BYTES if args.json else None)


def cmd_frames(args: argparse.Namespace) -> int:
    from workbench.store.db import StoreError  # duckdb: loaded by the reader anyway

    reader = reader_from(args)
    session_id = resolve_session(reader, args.session)
    dec = decoder_from(args) if args.json else None
    last = -1 if args.from_seq is None else args.from_seq - 1
    printed = 0
    while True:
        want = PAGE_ROWS if not args.limit else min(PAGE_ROWS, args.limit - printed)
        try:
            rows = _frame_page(reader, args, session_id, last, want)
            status = session_status(reader, session_id)
        except StoreError:
            if not args.follow:
                raise
            # The capture ended (its read service is gone) or is just starting: reopen, which
            # picks the live service or the file, whichever holds the data now.
            reader = _reopen(args, reader)
            continue
        for row in rows:
            _print_frame(row, dec)
            last = row["seq"]
            printed += 1
            if args.limit and printed >= args.limit:
                return 0
        sys.stdout.flush()
        if rows:
            continue  # the next page, without waiting
        if not args.follow:
            return 0
        if status is not None and status != "open":
            return 0
        time.sleep(0.3)


def _reopen(args: argparse.Namespace, old: Any) -> Any:
    from workbench.store.db import StoreError  # duckdb: loaded by the reader anyway

    old.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            return reader_from(args)
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _print_frame(row: dict[str, Any], dec: Decoder | None) -> None:
    if dec is not None:
        from workbench.decode.streamed import dump_frame  # protobuf: only --json decodes

        out = {k: v for k, v in row.items() if k != "payload" and v is not None}
        out["ts"] = str(row["ts"])
        # a big frame kept compressed is inflated as a stream, never whole (decode/streamed.py)
        dump_frame(dec, out, row["kind"], row["payload"] or b"", row["msg_type"], row["flags"] or 0,
                   json_stream(sys.stdout))  # exact JSON, no raw control character (workbench.textsafe)
        sys.stdout.write("\n")
        return
    from workbench.store.gate import wire_str  # loaded with the reader already; `decode` must not pay for it

    arrow = "→" if row["direction"] == "client" else "←"
    # a time past year 9999 (a hostile import's) is read as DuckDB's text: print that text
    ts = row["ts"].strftime("%H:%M:%S.%f")[:-3] if hasattr(row["ts"], "strftime") else str(row["ts"] or "")
    # kinds, summaries and errors quote the capture: control characters as visible escapes; a
    # summary is already written for display (its quotes and backslashes escaped), so display
    # form, of the text the store's wire-text rule stands for (wire_str), not of its stored form
    err = f"  [error: {escape_display(wire_str(row['error']))}]" if row["error"] else ""
    summary = escape_display(wire_str(row["summary"] or ""))
    print(f"{row['seq']:>7} {escape(ts)} {arrow} {escape(row['kind']):<44} {summary}{err}")


def cmd_sql(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise CliError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if not args.max_result_mb > 0:
        raise CliError(f"--max-result-mb {args.max_result_mb:g}: must be positive")
    # duckdb and pyarrow: the commands that read a database load them, not decode or --help
    from workbench.store.db import StoreError
    from workbench.store.reader import open_reader
    from workbench.store.readonly import ReadLimits

    limits = ReadLimits(args.timeout, int(args.max_result_mb * MIB))
    reader = open_reader(args.db, limits)
    try:
        table = reader.query(args.query)
    except StoreError:
        raise
    except Exception as exc:  # duckdb errors carry the useful text
        raise CliError(f"query failed: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from exc
    finally:
        reader.close()
    if args.json:
        for row in table_rows(table):
            print(json.dumps(row, default=_json_default))
    else:
        print_table(table)
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    return str(value)

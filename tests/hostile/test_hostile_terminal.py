"""Source: any text field of any capture (agent side, OpenAI side, stream-json), and the commands'
own arguments; the views a person reads: ``sessions``, ``frames`` (and ``--follow``), ``tools``,
``blobs``, ``diagnose``, ``diff``, ``sql``, ``decode``, and the one error path.

Invariant (issue 35): no command's stdout or stderr holds a raw control character other than the
newline and tab it writes itself (C0, DEL, C1, bidi, zero-width, lone surrogates are shown as
visible escapes by workbench.textsafe), and ``--json`` stays exact JSON; (a) no traceback. The
views run in process for speed (``invariants.run_in_process``, as the other properties' views do);
``test_terminal_output_of_real_processes`` runs a few as processes and reads their bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from invariants import clean_exit, run_in_process
from strategies import hostile, tried
from support import env_without_proxy, run_workbench
from terminal import (
    ALL_ATTACKS,
    ATTACKS,
    agent_messages,
    assert_terminal_safe,
    hostile_har,
    hostile_ndjson,
    hostile_text,
)

from workbench.textsafe import escape, escape_display

pytestmark = pytest.mark.slow


def _database(d: Path, h: str) -> tuple[Path, list[str]]:
    """``h`` everywhere, imported the way a user's files are; the session ids."""
    db = d / "run" / "c.duckdb"
    (d / "in" / "t.har").write_bytes(hostile_har(h))
    # stream-json names its own session: its id is the attacker's too
    (d / "in" / "t.ndjson").write_bytes(hostile_ndjson(h, f"ndjson-{h}"))
    for name in ("t.har", "t.ndjson"):
        r = run_in_process("import", str(d / "in" / name), "--db", str(db))
        clean_exit(r, [d / "in" / name], f"import {name}")
        assert_terminal_safe(f"import {name}", r)
    r = run_in_process("sessions", "--json", "--db", str(db))
    return db, [json.loads(line)["session_id"] for line in r["out"].splitlines()]


def _views(db: Path, ids: list[str], h: str) -> list[tuple[str, ...]]:
    """Every view of the database, and the error path (a session id that is not there)."""
    views: list[tuple[str, ...]] = [("sessions",), ("sessions", "--json"), ("diagnose", "--all"),
                                    ("diagnose", "--all", "--json"),
                                    ("sql", "SELECT * FROM sessions"), ("sql", "SELECT * FROM frames"),
                                    ("sql", "SELECT * FROM frames", "--json"), ("sql", "SELECT * FROM tool_calls"),
                                    ("sql", "SELECT chr(27) || ']0;x' || chr(7) || chr(155) || '2J' AS c")]
    for sid in ids:
        views += [("frames", sid), ("frames", sid, "--json"), ("frames", sid, "--follow"), ("tools", sid),
                  ("tools", sid, "--json"), ("blobs", sid), ("blobs", sid, "--json"), ("diagnose", sid),
                  ("export-fixture", sid, "-o", str(db.parent / "fixtures"))]
    for a, b in zip(ids, ids[1:], strict=False):
        views += [("diff", a, b), ("diff", a, b, "--json")]
    # the error path: a session id that is not there, quoted back (after "--": an id may start with "-")
    return [(*v, "--db", str(db)) for v in views] + [("frames", "--db", str(db), "--", h)]


def _check(args: tuple[str, ...], r: dict[str, Any], inputs: list[Any]) -> None:
    label = " ".join(a if len(a) < 40 else a[:37] + "…" for a in args[:3])
    clean_exit(r, inputs, label)
    assert_terminal_safe(label, r)
    if "--json" in args and r["rc"] in (0, 1):
        for line in r["out"].splitlines() if args[0] != "diff" else [r["out"]]:
            if line.strip():
                json.loads(line)  # still exact JSON


@hostile(6)
@given(h=hostile_text)
def test_views_print_no_raw_control_character(h: str, scratch: Callable[[], Path]) -> None:
    tried("test_views_print_no_raw_control_character")
    d = scratch()
    db, ids = _database(d, h)
    assert len(ids) == 3, f"3 sessions imported, {len(ids)} listed"
    outputs = {}
    for args in _views(db, ids, h):
        r = run_in_process(*args)
        _check(args, r, [db, escape(h)])
        outputs[args[:2]] = r["out"]
    # the hostile text did reach the views, shown escaped: the property is not met by printing nothing
    escapes = [e for c, e in (("\x1b", "\\x1b"), ("\x9b", "\\x9b"), ("\r", "\\r"), ("\u202e", "\\u202e")) if c in h]
    for sid in ids:
        text = outputs[("frames", sid)]
        assert any(e in text for e in escapes), f"frames {sid} shows none of {escapes} for {h!r}:\n{text[:2000]}"


@hostile(6)
@given(h=hostile_text)
def test_decode_and_errors_print_no_raw_control_character(h: str, scratch: Callable[[], Path]) -> None:
    tried("test_decode_and_errors_print_no_raw_control_character")
    d = scratch()
    client, server = agent_messages(h)
    batch = d / "in" / "batch.ndjson"
    batch.write_text("".join(json.dumps({"hex": m.hex(), "direction": "server"}) + "\n" for m in server))
    missing = d / "in" / h.replace("\0", "").replace("/", "")[:200]
    runs: list[tuple[tuple[str, ...], list[Any]]] = [
        (("decode", b"".join(server).hex()), []),
        (("decode", b"".join(server).hex(), "--json"), []),
        (("decode", b"".join(client).hex(), "--direction", "client"), []),
        (("decode", "--batch", "--file", str(batch)), [batch]),
        (("decode", "--file", str(missing)), [escape_display(str(missing))]),
        (("frames", "x", "--db", str(missing)), [escape_display(str(missing))]),
        (("sessions", "--db", str(missing)), [escape_display(str(missing))]),
        (("tools", h, "--db", str(missing)), [escape_display(str(missing))]),
        (("sql", f"SELECT '{h.replace(chr(39), chr(39) * 2)}' AS c", "--db", str(missing)), [escape_display(str(missing))]),
        (("decode", h), ["hex argument"]),
        (("frames", "--kind"), ["--kind"]),
        (("sessions", h), []),  # argparse: "unrecognized arguments" quotes it
    ]
    for args, inputs in runs:
        r = run_in_process(*args)
        if args[0] == "sessions" and len(args) == 2:
            assert r["rc"] == 2 and "unrecognized arguments" in r["err"], r
            assert_terminal_safe("sessions <hostile argument>", r)
            continue
        _check(args, r, inputs)


def test_terminal_output_of_real_processes(tmp_path: Path) -> None:
    """The bytes real ``workbench`` processes write for a capture holding every attack."""
    (tmp_path / "in").mkdir()
    (tmp_path / "run").mkdir()
    db, ids = _database(tmp_path, ALL_ATTACKS)
    agent = ids[0]
    forbidden = [a.encode() for a in ("\x1b", "\x07", "\r", "\x9b", "\u202e")]
    for args in (("sessions",), ("frames", agent), ("tools", agent), ("diff", ids[0], ids[1]),
                 ("sql", "SELECT kind, summary FROM frames"), ("frames", ALL_ATTACKS)):
        r = run_workbench(*args, "--db", str(db), env=env_without_proxy())
        assert "Traceback" not in r.stderr, r.stderr
        for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
            data = text.encode("utf-8", "surrogateescape")
            hits = [f for f in forbidden if f in data]
            assert not hits, f"`workbench {args[0]}` wrote {hits} to {stream}: {data[-800:]!r}"
    # and what it shows instead: each attack, escaped
    r = run_workbench("frames", agent, "--db", str(db), env=env_without_proxy())
    for attack in ATTACKS:
        assert escape(attack)[:12] in r.stdout, f"{attack!r} is not shown escaped in frames:\n{r.stdout[:3000]}"

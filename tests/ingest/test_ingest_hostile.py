"""Hostile files for the importers (issue 20, findings 5 and 6, and one inflate budget).

Each input is built here as a real file (flow files by mitmproxy's own ``FlowWriter``) and
imported by a real ``workbench import`` process: exit 0 or 2 naming the file, never a traceback;
a body that would inflate past a budget is stored as one ``compressed`` frame with an error naming
the budget; peak RSS is read with ``getrusage`` in a wrapper process (``benchmarks/memory.py``).
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from support import WORKBENCH, load_benchmark, run_workbench

from workbench.decode.classify import default_decoder
from workbench.ingest.exchange import decode_exchange, exchange_meta
from workbench.ingest.flowfile import read_exchanges
from workbench.ingest.pcap_streams import WireExchange, _undo_content_coding
from workbench.protocol.routes import Route
from workbench.redact import marker
from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, encode
from workbench.wire.inflate import MIB, InflateBudget, use_budget

RUN = "/agent.v1.AgentService/Run"
# Well above what an import of a tiny file costs (~200 MiB: Python, DuckDB, mitmproxy), well
# below what the bombs cost without the budget (1.4 GB for the .zhar, > 5.9 GB for the flow file).
RSS_BOUND_KIB = 600 * 1024


MEM = load_benchmark("memory")


def _flow(path: Path, *, body: bytes = b"", resp_body: bytes | None = None,
          req_headers: tuple[tuple[bytes, bytes], ...] = (), resp_headers: tuple[tuple[bytes, bytes], ...] = (),
          path_bytes: bytes = RUN.encode(), t: float | None = None) -> Path:
    """A flow file with one h2 Run, written by mitmproxy's FlowWriter; bodies as on the wire."""
    from mitmproxy import http, io
    from mitmproxy.test import tflow

    req = http.Request.make("POST", f"https://api2.cursor.sh{RUN}", b"",
                            {"content-type": "application/connect+proto", "connect-protocol-version": "1"})
    req.path = path_bytes  # type: ignore[assignment]  # mitmproxy accepts bytes and keeps them as sent
    req.headers.fields = (*req.headers.fields, *req_headers)
    req.raw_content = body
    req.http_version = "HTTP/2.0"
    resp = http.Response.make(200, b"", {"content-type": "application/connect+proto"})
    resp.headers.fields = (*resp.headers.fields, *resp_headers)
    resp.raw_content = encode(b"{}", flags=FLAG_END_STREAM) if resp_body is None else resp_body
    resp.http_version = "HTTP/2.0"
    flow = tflow.tflow(req=req, resp=resp)
    if t is not None:
        req.timestamp_start = req.timestamp_end = resp.timestamp_start = resp.timestamp_end = t
    with path.open("wb") as fh:
        io.FlowWriter(fh).add(flow)
    return path


def _rows(db: Path, sql: str) -> list[dict[str, Any]]:
    r = run_workbench("sql", sql, "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _no_traceback(r: Any) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-2000:]


# finding 5: unbounded inflation --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_content_encoded_bomb_is_kept_compressed_within_bounded_memory(tmp_path: Path, coding: str) -> None:
    """Issue 20's 42 KB flow file: a body with content-encoding that inflates to 40 MiB of zeros."""
    flows = MEM.build_content_bomb(tmp_path / f"bomb-{coding}.flows", 40, coding)
    assert flows.stat().st_size < 100_000
    db = tmp_path / "bomb.duckdb"
    r = MEM.measure([*WORKBENCH, "import", str(flows), "--db", str(db)])
    assert r["rc"] == 0, r["err"]
    assert "Traceback" not in r["err"]
    assert r["rss_kib"] < RSS_BOUND_KIB, f"import peaked at {r['rss_kib'] // 1024} MiB"
    rows = _rows(db, "SELECT kind, size, error, meta->>'content_encoding' AS coding FROM frames "
                     "WHERE direction = 'server'")
    assert len(rows) == 1  # one frame, never millions of empty envelopes
    (row,) = rows
    assert row["kind"] == "compressed"
    assert row["coding"] == coding
    (ex,), _, _ = read_exchanges(flows)
    # a stream's body of envelopes cannot be searched for credentials uninflated: its hash only
    assert row["size"] == len(marker(ex.resp_body or b"").encode())
    assert f"stored as a hash ({len(ex.resp_body or b''):,} bytes)" in row["error"]
    assert "32 MiB per-frame inflate budget" in row["error"]
    assert "--inflate-frame-mb" in row["error"]


@pytest.mark.slow
def test_zero_envelopes_under_the_byte_budget_are_still_refused(tmp_path: Path) -> None:
    """8 MiB of zeros pass the 32 MiB per-frame budget as bytes, but are 1.7 million empty
    envelopes: charged per envelope, the body is kept compressed instead."""
    flows = MEM.build_content_bomb(tmp_path / "flood.flows", 8)
    db = tmp_path / "flood.duckdb"
    r = MEM.measure([*WORKBENCH, "import", str(flows), "--db", str(db)])
    assert r["rc"] == 0, r["err"]
    assert r["rss_kib"] < RSS_BOUND_KIB, f"import peaked at {r['rss_kib'] // 1024} MiB"
    rows = _rows(db, "SELECT kind, error FROM frames WHERE direction = 'server'")
    assert [row["kind"] for row in rows] == ["compressed"]
    assert "envelopes" in rows[0]["error"] and "per-frame inflate budget" in rows[0]["error"]


@pytest.mark.slow
def test_content_encoded_body_within_budget_is_decoded(tmp_path: Path) -> None:
    delta = MEM.plain_text_delta(2000)
    body = encode(delta) + encode(delta) + encode(b"{}", flags=FLAG_END_STREAM)
    flows = _flow(tmp_path / "ok.flows", resp_body=gzip.compress(body), resp_headers=((b"content-encoding", b"gzip"),))
    db = tmp_path / "ok.duckdb"
    r = run_workbench("import", str(flows), "--db", str(db))
    assert r.returncode == 0, r.stderr
    kinds = [row["kind"] for row in _rows(db, "SELECT kind FROM frames WHERE direction = 'server' ORDER BY seq")]
    assert kinds == ["interaction_update.text_delta", "interaction_update.text_delta", "end_stream"]
    # the same body past a budget the user set: one frame (a stream's body: its hash)
    db2 = tmp_path / "small.duckdb"
    r = run_workbench("import", str(flows), "--db", str(db2), "--inflate-frame-mb", "0.001")
    assert r.returncode == 0, r.stderr
    rows = _rows(db2, "SELECT kind, flags, error FROM frames WHERE direction = 'server'")
    assert [(row["kind"], row["flags"]) for row in rows] == [("compressed", 0)]
    assert "per-frame inflate budget" in rows[0]["error"] and "the response body (" in rows[0]["error"]


@pytest.mark.slow
def test_unary_body_past_the_budget_is_kept_and_inflated_when_viewed(tmp_path: Path) -> None:
    message = b"\x0a\x05hello" * 400  # protobuf: field 1, length 5, repeated
    flows = _flow(tmp_path / "unary.flows", resp_body=gzip.compress(message),
                  resp_headers=((b"content-encoding", b"gzip"),), path_bytes=b"/aiserver.v1.AiService/Anything")
    db = tmp_path / "u.duckdb"
    r = run_workbench("import", str(flows), "--db", str(db), "--inflate-frame-mb", "0.001")
    assert r.returncode == 0, r.stderr
    rows = _rows(db, "SELECT session_id, kind, flags, size, error, meta->>'content_encoding' AS coding "
                     "FROM frames WHERE direction = 'server'")
    assert [(row["kind"], row["flags"], row["coding"]) for row in rows] == [("compressed", FLAG_COMPRESSED, "gzip")]
    assert rows[0]["size"] == len(gzip.compress(message))  # as it crossed the wire
    assert "per-frame inflate budget" in rows[0]["error"]
    r = run_workbench("frames", rows[0]["session_id"], "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    _no_traceback(r)
    (doc,) = [d for d in map(json.loads, r.stdout.splitlines()) if d["kind"] == "compressed"]
    assert doc["fields"]["$inflated"]["size"] == len(message)


@pytest.mark.slow
def test_zhar_bomb_is_refused_naming_the_budget(tmp_path: Path) -> None:
    """Issue 20's 407 KB .zhar (1.4 GB RSS before): exit 2 naming the file and the budget."""
    zhar = MEM.build_zhar_bomb(tmp_path / "bomb.zhar", 400)
    assert zhar.stat().st_size < 500_000
    r = MEM.measure([*WORKBENCH, "import", str(zhar), "--db", str(tmp_path / "z.duckdb")])
    assert r["rc"] == 2, r["err"]
    assert "Traceback" not in r["err"]
    assert str(zhar) in r["err"]
    assert "256 MiB per-session inflate budget" in r["err"] and "--inflate-session-mb" in r["err"]
    assert r["rss_kib"] < RSS_BOUND_KIB, f"import peaked at {r['rss_kib'] // 1024} MiB"
    # raised past the document, the same file is read (and is a HAR without entries)
    small = MEM.build_zhar_bomb(tmp_path / "small.zhar", 3)
    r2 = run_workbench("import", str(small), "--db", str(tmp_path / "s.duckdb"), "--inflate-session-mb", "2")
    assert r2.returncode == 2 and "2 MiB per-session inflate budget" in r2.stderr
    r3 = run_workbench("import", str(small), "--db", str(tmp_path / "s.duckdb"), "--inflate-session-mb", "4")
    assert r3.returncode == 0, r3.stderr
    assert "0 sessions" in r3.stdout


@pytest.mark.slow
def test_har_base64_body_is_charged_to_the_budget(tmp_path: Path) -> None:
    payload = encode(MEM.gzip_text_delta(3 * MIB), flags=FLAG_COMPRESSED) + encode(b"{}", flags=FLAG_END_STREAM)
    entry = {"startedDateTime": "2026-01-01T00:00:00Z", "time": 5,
             "request": {"method": "POST", "url": f"https://api2.cursor.sh{RUN}", "httpVersion": "HTTP/2.0",
                         "headers": [{"name": "content-type", "value": "application/connect+proto"}],
                         "postData": {"mimeType": "application/connect+proto", "text": ""}},
             "response": {"status": 200, "headers": [{"name": "content-type", "value": "application/connect+proto"}],
                          "content": {"size": len(payload), "encoding": "base64",
                                      "text": base64.b64encode(payload).decode()}},
             "timings": {"send": 1, "wait": 1, "receive": 1}}
    har = tmp_path / "b64.har"
    har.write_text(json.dumps({"log": {"version": "1.2", "entries": [entry]}}))
    db = tmp_path / "h.duckdb"
    r = run_workbench("import", str(har), "--db", str(db), "--inflate-frame-mb", "2")
    assert r.returncode == 0, r.stderr
    rows = _rows(db, "SELECT kind, error FROM frames WHERE direction = 'server' ORDER BY seq")
    assert [row["kind"] for row in rows] == ["compressed", "end_stream"]
    assert "2 MiB per-frame inflate budget" in rows[0]["error"]


def test_pcap_body_content_coding_goes_through_the_budget() -> None:
    """A packet capture's content-encoded body: undone by the same budgeted inflate."""
    ex = WireExchange(ident="stream 1", stream_key="1", session_key="pcap-1", method="POST", host="h", path=RUN,
                      resp_headers=[("content-type", "application/connect+proto"), ("content-encoding", "gzip")],
                      status=200, resp_body=MEM.zero_stream(40 * MIB), resp_end=(7, 7_000_000))
    ex.resp_chunks = [(5, 5_000_000, ex.resp_body[:100]), (6, 6_000_000, ex.resp_body[100:])]
    _undo_content_coding(ex, "server")
    assert ex.resp_chunks == [(7, 7_000_000, ex.resp_body)]  # one body, complete at its end
    route = ex.route
    assert isinstance(route, Route)
    with use_budget(InflateBudget.for_import()):
        part = decode_exchange(default_decoder(), ex, route)
    assert [f.kind for f in part.server] == ["compressed"]
    assert "per-frame inflate budget" in (part.server[0].error or "")
    assert ex.resp_body not in part.server[0].payload  # a stream's body: stored as its hash


# finding 6: tracebacks instead of exit 2 -----------------------------------------------------

def _deep_tnetstring(depth: int) -> bytes:
    """A list nested ``depth`` deep (lengths computed from the inside out: no quadratic copying)."""
    lengths = [3]  # b"0:~", the innermost value
    for _ in range(depth):
        lengths.append(len(str(lengths[-1])) + 1 + lengths[-1] + 1)
    return b"".join(f"{n}:".encode() for n in reversed(lengths[:-1])) + b"0:~" + b"]" * depth


DEEP = 100_000
NESTED = b"[" * DEEP + b"]" * DEEP


@pytest.mark.slow
@pytest.mark.parametrize(("name", "content", "fmt"), [
    ("deep.json", NESTED, None),
    ("deep.har", b'{"log": {"entries": ' + NESTED + b"}}", None),
    ("deep-pretty.har", b'{"log": {"version": "1.2",\n "entries": ' + NESTED + b"}}", None),
    ("deep-first.ndjson", b'{"type": "x", "a": ' + NESTED + b"}\n", None),
    ("deep.flows", _deep_tnetstring(DEEP), None),
    ("deep-as-har.json", NESTED, "har"),
    ("deep-as-flow.json", NESTED, "flow"),
], ids=["json", "har", "pretty-har", "ndjson", "flows", "as-har", "as-flow"])  # short ids: PYTEST_CURRENT_TEST is in the child's environment
def test_deeply_nested_files_exit_2_naming_them(tmp_path: Path, name: str, content: bytes, fmt: str | None) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    r = run_workbench("import", str(path), "--db", str(tmp_path / "d.duckdb"), *(["--format", fmt] if fmt else []))
    _no_traceback(r)
    assert r.returncode == 2, r.stderr
    assert str(path) in r.stderr


@pytest.mark.slow
def test_deeply_nested_ndjson_line_is_a_malformed_frame(tmp_path: Path) -> None:
    path = tmp_path / "deep.ndjson"
    path.write_bytes(b'{"type": "system", "subtype": "init", "session_id": "s1"}\n{"type": "x", "a": '
                     + NESTED + b"}\n" + b'{"type": "result", "subtype": "success", "session_id": "s1"}\n')
    db = tmp_path / "n.duckdb"
    r = run_workbench("import", str(path), "--db", str(db))
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    rows = _rows(db, "SELECT kind, error FROM frames ORDER BY seq")
    assert [row["kind"] for row in rows] == ["system.init", "malformed", "result.success"]
    assert "line 2" in rows[1]["error"] and "nested too deeply" in rows[1]["error"]


BAD_TIMES = [1e13, math.nan, -5.0, math.inf, -math.inf, 1e300, 253_402_300_800.0]


@pytest.mark.slow
def test_flow_with_impossible_times_imports(tmp_path: Path) -> None:
    """Past year 9999, negative, NaN, infinite: the time is unknown, the flow is imported."""
    for i, t in enumerate(BAD_TIMES):
        flows = _flow(tmp_path / f"t{i}.flows", t=t)
        db = tmp_path / f"t{i}.duckdb"
        r = run_workbench("import", str(flows), "--db", str(db))
        _no_traceback(r)
        assert r.returncode == 0, (t, r.stderr)
        rows = _rows(db, "SELECT kind, year(ts) AS y FROM frames")
        assert [row["kind"] for row in rows] == ["end_stream"]
        assert 1970 <= rows[0]["y"] <= 9999


@pytest.mark.slow
def test_ndjson_with_impossible_timestamps_imports(tmp_path: Path) -> None:
    values = ["253402300800000", "1e300", "1e400", "-5", "NaN", "Infinity", "-Infinity", "9e18", '"soon"']
    path = tmp_path / "times.ndjson"
    path.write_text("".join(f'{{"type": "assistant", "session_id": "s1", "timestamp_ms": {v}, '
                            f'"message": {{"content": [{{"type": "text", "text": "{i}"}}]}}}}\n'
                            for i, v in enumerate(values)))
    db = tmp_path / "n.duckdb"
    r = run_workbench("import", str(path), "--db", str(db))
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    rows = _rows(db, "SELECT year(ts) AS y FROM frames")
    assert len(rows) == len(values)
    assert all(1970 <= row["y"] <= 9999 for row in rows)


# non-UTF-8 header bytes (finding 1, the importer's side) ---------------------------------------

NON_UTF8_REQ = ((b"x-cursor-client-version", b"1.0\xff"), (b"x-request-id", b"req-\xe9"))
NON_UTF8_RESP = ((b"grpc-message", b"caf\xe9 down"),)
NON_UTF8_PATH = RUN.encode() + b"?v=\xff"


def test_importer_passes_non_utf8_header_bytes_on(tmp_path: Path) -> None:
    """The importer reads such bytes as surrogate-escaped text (the original bytes recoverable) and
    decodes the exchange without an exception; storing them is the store's escape (the gate)."""
    flows = _flow(tmp_path / "bytes.flows", req_headers=NON_UTF8_REQ, resp_headers=NON_UTF8_RESP,
                  path_bytes=NON_UTF8_PATH)
    (ex,), other, repeats = read_exchanges(flows)
    assert (other, repeats) == (0, 0)
    assert ex.path.encode("utf-8", "surrogateescape") == NON_UTF8_PATH
    assert ex.header("x-cursor-client-version").encode("utf-8", "surrogateescape") == b"1.0\xff"  # type: ignore[union-attr]
    assert ex.header("grpc-message", response=True).encode("utf-8", "surrogateescape") == b"caf\xe9 down"  # type: ignore[union-attr]
    route = ex.route
    assert route is not None
    with use_budget(InflateBudget.for_import()):
        part = decode_exchange(default_decoder(), ex, route)
    assert [f.kind for f in part.server] == ["end_stream"]
    assert part.request_id is not None and part.request_id.encode("utf-8", "surrogateescape") == b"req-\xe9"
    json.dumps(exchange_meta(ex))  # the session's meta serialises (JSON escapes the surrogates)


@pytest.mark.slow
def test_flow_with_non_utf8_header_bytes_imports(tmp_path: Path) -> None:
    flows = _flow(tmp_path / "bytes.flows", req_headers=NON_UTF8_REQ, resp_headers=NON_UTF8_RESP,
                  path_bytes=NON_UTF8_PATH)
    db = tmp_path / "b.duckdb"
    r = run_workbench("import", str(flows), "--db", str(db))
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert _rows(db, "SELECT count(*) AS n FROM sessions") == [{"n": 1}]
    assert _rows(db, "SELECT count(*) AS n FROM frames") == [{"n": 1}]


@pytest.mark.slow
def test_gzip_fixture_bomb_is_refused_naming_the_budget(tmp_path: Path) -> None:
    """A gzip'd fixture is inflated within the same budgets (one document, like a .zhar)."""
    import zlib

    from workbench.fixtures.format import FORMAT

    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [comp.compress(json.dumps({"format": FORMAT}).encode()[:-1] + b', "x": "')]
    parts += [comp.compress(b"a" * MIB) for _ in range(300)]
    parts.append(comp.compress(b'"}') + comp.flush())
    fixture = tmp_path / "bomb.json.gz"
    fixture.write_bytes(b"".join(parts))
    r = MEM.measure([*WORKBENCH, "import", str(fixture), "--db", str(tmp_path / "f.duckdb")])
    assert r["rc"] == 2, r["err"]
    assert "Traceback" not in r["err"]
    assert str(fixture) in r["err"] and "256 MiB per-session inflate budget" in r["err"]
    assert r["rss_kib"] < RSS_BOUND_KIB, f"import peaked at {r['rss_kib'] // 1024} MiB"


@pytest.mark.slow
def test_har_with_impossible_times_imports(tmp_path: Path) -> None:
    """A start time that leaves datetime's range once in UTC, infinite or NaN timings."""
    entries = []
    for i, (start, timing) in enumerate([("9999-12-31T23:59:59-14:00", 1), ("0001-01-01T00:00:00+14:00", 1),
                                          ("2026-01-01T00:00:00Z", math.inf), ("2026-01-01T00:00:00Z", math.nan),
                                          ("2026-01-01T00:00:00Z", 1e308)]):
        body = encode(b"{}", flags=FLAG_END_STREAM)
        entries.append({"startedDateTime": start, "time": timing,
                        "request": {"method": "POST", "url": f"https://api2.cursor.sh{RUN}?n={i}", "headers": []},
                        "response": {"status": 200, "headers": [],
                                     "content": {"encoding": "base64", "text": base64.b64encode(body).decode()}},
                        "timings": {"send": timing, "wait": timing, "receive": timing}})
    har = tmp_path / "times.har"
    har.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}))  # json writes Infinity/NaN
    db = tmp_path / "h.duckdb"
    r = run_workbench("import", str(har), "--db", str(db))
    _no_traceback(r)
    assert r.returncode == 0, r.stderr
    rows = _rows(db, "SELECT year(ts) AS y FROM frames")
    assert len(rows) == len(entries)
    assert all(1970 <= row["y"] <= 9999 for row in rows)


def test_packet_times_outside_datetime_range_are_unknown() -> None:
    """tshark prints whatever a pcapng's 64-bit timestamps say: such a time is unknown (0)."""
    from workbench.ingest.tshark import _ts_us

    assert _ts_us("1767225600.123456") == 1_767_225_600_123_456
    assert _ts_us("253402300800.000000") == 0  # year 10000
    assert _ts_us("-5.000000") == 0
    assert _ts_us("0.000000") == 0

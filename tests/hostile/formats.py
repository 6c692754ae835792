"""Generated exchanges written in each importer's format, the way its producer writes it.

Flow files are written by mitmproxy's own ``FlowWriter`` from a flow a real mitmdump recorded
(``tests/ingest/data/agent.flows``), with the hostile parts put in; HAR as mitmproxy exports it
(base64 bodies, ``.zhar`` = zlib); NDJSON as ``cursor-agent --output-format stream-json`` prints.
"""

from __future__ import annotations

import base64
import json
import uuid
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from strategies import RUN_PATH, Exchange

from workbench.store.gate import text_value

SAMPLE_FLOWS = Path(__file__).resolve().parents[1] / "ingest" / "data" / "agent.flows"


@lru_cache(maxsize=1)
def _run_template() -> Any:
    from mitmproxy import io

    with SAMPLE_FLOWS.open("rb") as fh:
        for f in io.FlowReader(fh).stream():
            if f.request.path.endswith("/Run"):
                return f
    raise AssertionError(f"{SAMPLE_FLOWS} has no Run flow")


def to_flow(ex: Exchange, *, content_encoding_body: bytes | None = None) -> Any:
    """A mitmproxy HTTPFlow for ``ex`` (h2 Run; reset recorded as the capture addon records it)."""
    from mitmproxy import flow as mflow
    from mitmproxy import http

    from workbench.protocol.status import RESET_METADATA_KEY

    f = _run_template().copy()
    f.id = str(uuid.uuid4())
    f.metadata = {}
    r = f.request
    r.http_version = "HTTP/2.0"
    r.headers = http.Headers(ex.request_headers())
    r.path = RUN_PATH.encode() + ex.path_suffix
    r.raw_content = b"".join(ex.client_envelopes())
    r.timestamp_start, r.timestamp_end = ex.timestamp, ex.timestamp + 0.1
    s = f.response
    s.status_code, s.http_version = 200, "HTTP/2.0"
    s.headers = http.Headers(ex.response_headers())
    s.raw_content = b"".join(ex.server_envelopes())
    if content_encoding_body is not None:
        s.headers["content-encoding"] = "gzip"
        s.raw_content = content_encoding_body
    s.trailers = http.Headers(ex.trailers) if ex.trailers else None
    s.timestamp_start, s.timestamp_end = ex.timestamp + 0.2, ex.timestamp + 0.3
    if ex.reset:
        f.error = mflow.Error("stream reset by server (PROTOCOL_ERROR)")
        f.metadata[RESET_METADATA_KEY] = {"side": "server", "code": 1, "after_response_end": False}
    return f


def write_flows(path: Path, flows: Iterable[Any]) -> None:
    from mitmproxy import io

    with path.open("wb") as fh:
        w = io.FlowWriter(fh)
        for f in flows:
            w.add(f)


def nested_tnetstring(depth: int) -> bytes:
    """A tnetstring list nested ``depth`` deep (``N:[...]``), built without quadratic copying."""
    lengths = [3]  # b"0:]"
    for _ in range(depth):
        inner = lengths[-1]
        lengths.append(len(str(inner)) + 1 + inner + 1)
    prefix = b"".join(f"{lengths[i]}:".encode() for i in range(depth - 1, -1, -1))
    return prefix + b"0:]" + b"]" * depth


# ------------------------------------------------------------------------------------------ HAR --

def _iso(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        # past what Python's datetime holds: written as the digits an exporter would print
        return f"{int(ts)}-01-01T00:00:00Z" if ts > 0 else "-0001-01-01T00:00:00Z"


def _har_headers(items: Sequence[tuple[bytes, bytes]]) -> list[dict[str, str]]:
    # mitmproxy's HAR export keeps header bytes as surrogate-escaped text (JSON-escaped on write)
    return [{"name": n.decode("utf-8", "surrogateescape"), "value": v.decode("utf-8", "surrogateescape")}
            for n, v in items]


def har_entry(ex: Exchange) -> dict[str, Any]:
    req_body = b"".join(ex.client_envelopes())
    resp_body = b"".join(ex.server_envelopes())
    return {
        "startedDateTime": _iso(ex.timestamp),
        "time": 300,
        "request": {
            "method": "POST", "url": "https://api2.cursor.sh" + (RUN_PATH.encode() + ex.path_suffix).decode(
                "utf-8", "surrogateescape"),
            "httpVersion": "HTTP/2.0", "headers": _har_headers(ex.request_headers()), "cookies": [],
            "queryString": [], "headersSize": -1, "bodySize": len(req_body),
            "postData": {"mimeType": "application/connect+proto",
                         "text": base64.b64encode(req_body).decode(), "encoding": "base64"},
        },
        "response": {
            "status": 200, "statusText": "", "httpVersion": "HTTP/2.0",
            "headers": _har_headers(ex.response_headers()), "cookies": [],
            "content": {"size": len(resp_body), "mimeType": "application/connect+proto",
                        "text": base64.b64encode(resp_body).decode(), "encoding": "base64"},
            "redirectURL": "", "headersSize": -1, "bodySize": len(resp_body),
            "_trailers": _har_headers(ex.trailers),
        },
        "cache": {}, "timings": {"send": 1, "wait": 100, "receive": 199},
    }


def har_document(entries: list[dict[str, Any]]) -> bytes:
    doc = {"log": {"version": "1.2", "creator": {"name": "mitmproxy", "version": "11.0.2"}, "entries": entries}}
    return json.dumps(doc, ensure_ascii=True).encode()


def zhar(data: bytes) -> bytes:
    return zlib.compress(data, 6)


def deep_json(depth: int, *, opener: bytes = b"[") -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    if opener == b"{":
        return b'{"a":' * depth + b"1" + closer * depth
    return opener * depth + closer * depth


# -------------------------------------------------------------------------------------- fixture --

def fixture_document(ex: Exchange, session_id: str) -> dict[str, Any]:
    """A ``workbench-fixture`` (format 1, as ``export-fixture`` writes it) holding ``ex`` unscrubbed:
    what a fixture from elsewhere (an older workbench, a hand-edited file) can hold."""
    import gzip as _gzip

    from strategies import credential_message, text_delta

    frames: list[dict[str, Any]] = []

    def add(direction: str, kind: str, payload: bytes, flags: int, msg_type: str | None) -> None:
        f: dict[str, Any] = {"seq": len(frames), "t": round(0.001 * len(frames), 6), "direction": direction,
                             "transport": "run", "kind": kind, "payload_b64": base64.b64encode(payload).decode(),
                             "flags": flags, "stream": "1"}
        if msg_type:
            f["msg_type"] = msg_type
        frames.append(f)

    for site, z in zip(ex.client_sites, ex.gzip_client, strict=True):
        msg = credential_message(site, ex.canary)
        add("client", "compressed" if z else site.path[0], _gzip.compress(msg) if z else msg, 1 if z else 0,
            "agent.v1.AgentClientMessage")
    for site, z in zip(ex.server_sites, ex.gzip_server, strict=True):
        msg = credential_message(site, ex.canary)
        add("server", "compressed" if z else "exec_server_message.subagent_args", _gzip.compress(msg) if z else msg,
            1 if z else 0, "agent.v1.AgentServerMessage")
    for i in range(ex.text_frames):
        add("server", "interaction_update.text_delta", text_delta(f"text {i}"), 0, "agent.v1.AgentServerMessage")
    if not ex.reset:
        add("server", "end_stream", b"{}", 2, None)
    headers = [[n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape")]
               for n, v in ex.request_headers()]
    return {
        "format": "workbench-fixture", "version": 1, "created_at": _iso(1.7e9), "workbench_version": "0.1.0",
        "session": {"session_id": session_id, "source": "capture", "transport": "run", "request_id": session_id,
                    "started_at": _iso(ex.timestamp), "ended_at": _iso(ex.timestamp), "frame_count": len(frames),
                    "status": "aborted" if ex.reset else "complete", "host": "api2.cursor.sh", "path": RUN_PATH,
                    "http_status": 200, "auth_hash": None, "error": None,
                    "meta": {"method": "POST", "request_headers": headers,
                             "trailers": [[n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape")]
                                          for n, v in ex.trailers]}},
        "scrub": {"secrets": False, "content": False, "frames_changed": 0},
        "expected_findings": [], "expected_findings_source": "database",
        "frames": frames,
    }


# -------------------------------------------------------------------------------------- Parquet --

def write_parquet_export(out: Path, docs: Sequence[dict[str, Any]], timestamps: Sequence[float]) -> int:
    """A ``workbench export --parquet`` folder (layout and ``_workbench.json`` as the exporter writes
    them) holding the sessions and frames of fixture documents (``fixture_document``), unredacted,
    with each session's wire times. Written with DuckDB's ``COPY … PARTITION_BY``. Returns the
    number of frame rows."""
    import duckdb

    con = duckdb.connect()
    con.execute("""CREATE TABLE sessions (session_id VARCHAR, source VARCHAR, transport VARCHAR, request_id VARCHAR,
        conversation_id VARCHAR, model VARCHAR, client_version VARCHAR, started_at TIMESTAMP, ended_at TIMESTAMP,
        frame_count BIGINT, status VARCHAR, host VARCHAR, path VARCHAR, http_status INTEGER, auth_hash VARCHAR,
        error VARCHAR, meta JSON, "date" DATE)""")
    con.execute("""CREATE TABLE frames (session_id VARCHAR, seq BIGINT, ts TIMESTAMP, direction VARCHAR,
        transport VARCHAR, stream VARCHAR, kind VARCHAR, summary VARCHAR, payload BLOB, raw BLOB, flags UTINYINT,
        msg_type VARCHAR, size INTEGER, ref_id BIGINT, call_id VARCHAR, append_seqno BIGINT, request_id VARCHAR,
        decoded JSON, error VARCHAR, source_key VARCHAR, "date" DATE)""")
    n = 0
    for doc, ts in zip(docs, timestamps, strict=True):
        s = doc["session"]
        t0 = "make_timestamp(CAST(? * 1e6 AS BIGINT))"
        con.execute(f"INSERT INTO sessions SELECT ?, ?, ?, ?, NULL, NULL, NULL, {t0}, {t0}, ?, ?, ?, ?, ?, NULL, NULL, ?,"
                    f" CAST({t0} AS DATE)",
                    [s["session_id"], s["source"], s["transport"], s["request_id"], ts, ts, s["frame_count"],
                     s["status"], s["host"], s["path"], s["http_status"],
                     # what an export of a workbench database holds: text the gate stored (valid UTF-8)
                     json.dumps(text_value(s["meta"])), ts])
        for f in doc["frames"]:
            payload = base64.b64decode(f["payload_b64"])
            con.execute(f"INSERT INTO frames SELECT ?, ?, {t0}, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, NULL, NULL, NULL, ?, NULL,"
                        f" NULL, NULL, CAST({t0} AS DATE)",
                        [s["session_id"], f["seq"], ts + f["t"], f["direction"], f["transport"], f["stream"], f["kind"],
                         f["kind"], payload, f["flags"], f.get("msg_type"), len(payload), s["request_id"], ts])
            n += 1
    for table in ("sessions", "frames"):
        con.execute(f"COPY {table} TO '{out / table}' (FORMAT parquet, PARTITION_BY (\"date\", session_id))")
    con.close()
    (out / "_workbench.json").write_text(json.dumps({
        "format": "workbench-parquet", "version": 1, "schema_version": 3,
        "layout": "<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet",
        "tables": ["sessions", "frames", "blobs", "tool_calls", "findings"], "exports": []}))
    return n

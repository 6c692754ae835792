"""Large import files for reliability tests, grown from traffic a real mitmdump recorded.

``tests/ingest/data/agent.flows`` (written by ``mitmdump -w``: a RunSSE with three BidiAppends, a
RunPoll with one, a rate-limited RunSSE, a streamed RunSSE, an h2 Run answered 464 and a unary call)
is repeated with fresh flow ids and request ids, so every copy is new traffic to an importer.
"""

from __future__ import annotations

import json
import uuid
from io import BytesIO
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "ingest" / "data"
SAMPLE_FLOWS = DATA / "agent.flows"
SAMPLE_NDJSON = DATA / "stream-json.ndjson"


def _template() -> tuple[list[bytes], list[str]]:
    """Each sample flow as mitmproxy serializes it, and the ids (flow ids, request ids) in them."""
    from mitmproxy import io

    with SAMPLE_FLOWS.open("rb") as fh:
        flows = list(io.FlowReader(fh).stream())
    serialized = []
    for f in flows:
        buf = BytesIO()
        io.FlowWriter(buf).add(f)
        serialized.append(buf.getvalue())
    ids = [f.id for f in flows] + sorted({f.request.headers.get("x-request-id") for f in flows} - {None})
    assert all(len(i) == 36 for i in ids)
    return serialized, ids


def write_flow_copies(path: Path, copies: int, *, append: bool = False) -> int:
    """Write (or append) ``copies`` copies of the sample with fresh flow and request ids.

    The ids are UUIDs replaced by UUIDs in mitmproxy's own serialization (same length, so every
    tnetstring length prefix stays right). Returns the number of flows written.
    """
    serialized, ids = _template()
    n = 0
    with path.open("ab" if append else "wb") as fh:
        for _ in range(copies):
            fresh = {old.encode(): str(uuid.uuid4()).encode() for old in ids}
            for blob in serialized:
                for old, new in fresh.items():
                    blob = blob.replace(old, new)
                fh.write(blob)
                n += 1
    return n


def write_ndjson_sessions(path: Path, sessions: int, *, append: bool = False) -> int:
    """``sessions`` copies of the stream-json sample, each under a session id of its own."""
    lines = SAMPLE_NDJSON.read_bytes().splitlines()
    sid = json.loads(lines[0])["session_id"]
    n = 0
    with path.open("ab" if append else "wb") as fh:
        for _ in range(sessions):
            fresh = str(uuid.uuid4()).encode()
            for line in lines:
                fh.write(line.replace(sid.encode(), fresh) + b"\n")
                n += 1
    return n

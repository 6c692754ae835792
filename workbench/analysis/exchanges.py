"""The HTTP exchanges that carried a session's frames: the facts the recorder kept about each
(``frames.meta``: HTTP status, content type, gRPC status) and the pairing of the server's
refusals with the BidiAppends they answer."""

from __future__ import annotations

import json
from typing import Any

from workbench.analysis.records import HttpFailure, SessionFacts
from workbench.protocol.status import parse_stream_error


def meta_fields(meta: Any) -> tuple[int | None, str | None, int | None]:
    """(http_status, content_type, grpc_status) from a ``frames.meta`` value (JSON text or a dict)."""
    if meta is None:
        return None, None, None
    if isinstance(meta, (str, bytes)):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None, None, None
    if not isinstance(meta, dict):
        return None, None, None
    ctype = meta.get("content_type")
    if not isinstance(ctype, str):
        headers = meta.get("request_headers")
        ctype = headers.get("content-type") if isinstance(headers, dict) else None
    return _int(meta.get("http_status")), ctype if isinstance(ctype, str) else None, _int(meta.get("grpc_status"))


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def link_http_errors(facts: SessionFacts) -> None:
    """Pair each refusal answering a BidiAppend (an ``http_error`` frame, an error trailer) with the
    append it answered (same request_id and append_seqno, the latest before it), so the append
    counts as refused even when the recorder kept no status on the append itself. Idempotent."""
    for e in facts.http_errors:
        if e.transport != "bidi_append" or e.seqno is None:
            continue
        match = None
        for a in facts.appends:
            if a.seq < e.seq and a.seqno == e.seqno and (e.request_id is None or a.request_id in (e.request_id, None)):
                match = a
        status = e.status if e.status is not None else (200 if e.grpc else None)
        if match is not None:
            known = facts.http_failures.get(match.seq)
            if known is None:
                facts.http_failures[match.seq] = HttpFailure(match.seq, "bidi_append", match.kind, status, None,
                                                             match.request_id, e.seqno, e.seq, e.text or None,
                                                             grpc=e.grpc)
            else:
                known.error_seq, known.error_text = e.seq, e.text or known.error_text
                known.status = known.status or status
                known.grpc = known.grpc or e.grpc
        elif not any(f.error_seq == e.seq for f in facts.http_failures.values()):
            facts.http_failures[e.seq] = HttpFailure(e.seq, "bidi_append", "a message the recording did not keep",
                                                     status, None, e.request_id, e.seqno, e.seq, e.text or None,
                                                     grpc=e.grpc)


def error_code(payload: bytes, flags: int) -> str:
    try:
        return parse_stream_error(payload, flags).code
    except ValueError:
        return "unknown"

"""An OpenAI client's automatic retry of a request the bridge failed with a 5xx.

The official SDKs retry a 5xx answer on their own (twice by default, after a short back-off),
sending the very same body again. To the bridge that is a new request: a new run, while whatever
the failed attempt did on the agent side (the run it started, the blobs that run stored, the
conversation state it left) may or may not carry over. ``bridge_client_retry`` names the retry as
a retry of the failed request (same body, shortly after the 5xx) and says what the retried run then
missed — a blob the server asked for that the client could not serve (``blob_miss`` there follows
from it, analysis/causes.py).
"""

from __future__ import annotations

from workbench.analysis.bridge_join import JOINED, request_payload
from workbench.analysis.bridge_pair import BridgeFinding, FailedAttempt, Pair
from workbench.store import bridge_reads as reads
from workbench.store.queries import Reader

# A request with the same body this soon after a 5xx answer is the client's retry of it (the SDKs
# back off 0.5 s to 8 s; a person resending by hand takes longer and usually changes something).
RETRY_WINDOW_S = 30.0


def failed_attempts(src: Reader, sid: str, payload: bytes | None, start_us: int) -> list[FailedAttempt]:
    """The earlier requests with this exact body that the bridge answered 5xx, each ending at most
    ``RETRY_WINDOW_S`` before the next attempt started (oldest first)."""
    if not payload:
        return []
    out: list[FailedAttempt] = []
    at = start_us
    for _ in range(10):  # (a bounded chain: the SDKs retry two or three times)
        earlier = [r["session_id"] for r in reads.sessions_started_between(
            src, JOINED, at - int(RETRY_WINDOW_S * 1e6), at) if r["session_id"] != sid]
        found = None
        for o in reversed(earlier):
            if o in {a.session_id for a in out}:
                continue
            row = reads.session_span(src, o)
            status = row["http_status"] if row is not None else None
            end = row["end_us"] if row is not None else None
            if status is None or status < 500 or end is None or end > at:
                continue
            if request_payload(src, o) == payload:
                found = FailedAttempt(o, int(status), int(end))
                break
        if found is None:
            break
        out.append(found)
        at = found.end_us
    return list(reversed(out))


def rule_client_retry(p: Pair) -> list[BridgeFinding]:
    if not p.retry_of:
        return []
    last = p.retry_of[-1]
    first = p.retry_of[0]
    gap = max(0, p.start_us - last.end_us) / 1e6
    misses = {s.session_id: s.blob_misses for s in p.caused if s.blob_misses}
    miss_text = ""
    if misses:
        run, seqs = next(iter(misses.items()))
        miss_text = (f"; the retried run {run[:8]} then missed {len(seqs)} blob(s) the server asked for "
                     f"(blob_miss at seq {', '.join(map(str, seqs[:5]))}): the state the failed attempt's run "
                     "left was resumed without the blobs that run had been given")
    message = (f"this request is the OpenAI client's automatic retry (attempt {len(p.retry_of) + 1}) of request "
               f"{first.session_id[:8]}: the same body, sent {gap:.1f} s after the bridge answered HTTP "
               f"{last.http_status}" + miss_text)
    agent = {s.session_id: ([f["seq"] for f in s.frames if f["direction"] == "client"][:1] + s.blob_misses[:5])
             for s in p.caused}
    return [BridgeFinding(
        "bridge_client_retry", "warning", message,
        "answer a 5xx only when nothing happened on the agent side, or make the retry safe: keep the failed "
        "attempt's conversation and blobs for the same body, or start the retry from a clean conversation",
        [p.request_seq] if p.request_seq is not None else [], agent)]

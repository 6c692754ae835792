"""Rules about the HTTP exchanges that carry a run: append_seqno_anomaly, append_rejected,
unary_error, end_stream_not_delivered."""

from __future__ import annotations

import statistics

from workbench.analysis.context import ORDER_TIME, Context, rule
from workbench.analysis.model import Finding
from workbench.analysis.records import Append, HttpFailure
from workbench.analysis.rows import SessionRecord
from workbench.protocol import kinds
from workbench.protocol.status import DEFAULT_FIX, ERROR_FIX, grpc_code_name, http_cause, looks_enveloped


def _failed(status: int | None) -> bool:
    """A recorded answer that did not accept the request (0 = the exchange got no answer)."""
    return status is not None and not 200 <= status < 300


@rule("append_seqno_anomaly", "warning", "BidiAppend append_seqno reset, reused for another message, or a gap")
def append_seqno_anomaly(ctx: Context) -> list[Finding]:
    """Per request_id the seqnos must run 0, 1, 2, … with one message each. A resend of the same
    message under its seqno after the first attempt failed (non-2xx or no answer) is a correct
    retry, not an anomaly; the same seqno on two different messages is (two counters, a reset)."""
    out = []
    by_req: dict[str | None, list[Append]] = {}
    for a in ctx.facts.appends:
        by_req.setdefault(a.request_id, []).append(a)
    for rid, appends in by_req.items():
        first: dict[int, Append] = {}
        last: dict[int, Append] = {}
        high = -1
        problems: list[str] = []
        ev: list[int] = []
        for a in appends:
            prev = last.get(a.seqno)
            if prev is not None:
                retry = (a.digest is not None and a.digest == prev.digest
                         and (_failed(prev.http_status) or prev.seq in ctx.facts.http_failures))
                if not retry:
                    if a.seqno == 0 and high > 0:
                        problems.append(f"restart at 0 (seq {a.seq}) after {high}")
                    elif a.digest is not None and a.digest != first[a.seqno].digest:
                        problems.append(f"seqno {a.seqno} reused for a different message (seq {first[a.seqno].seq} "
                                        f"{first[a.seqno].kind}, seq {a.seq} {a.kind})")
                    else:
                        problems.append(f"duplicate {a.seqno} (seq {a.seq})")
                    ev += [first[a.seqno].seq, a.seq]
            elif a.seqno == 0 and high > 0:
                problems.append(f"restart at 0 (seq {a.seq}) after {high}")
                ev.append(a.seq)
            first.setdefault(a.seqno, a)
            last[a.seqno] = a
            high = max(high, a.seqno)
        missing = sorted(set(range(0, high + 1)) - set(first))
        if missing and (ctx.final or len(appends) > 16):
            problems.append(f"gap: {', '.join(map(str, missing[:10]))} never sent")
            ev += [a.seq for a in appends if a.seqno > missing[0]][:3]
        if problems:
            out.append(ctx.finding(
                "append_seqno_anomaly",
                f"BidiAppend request_id {rid}: " + "; ".join(problems[:6])
                + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else "")
                + ". The server orders appends by seqno: a message it never sees leaves its exec/query unanswered.",
                ev,
                "Keep one append_seqno counter per request_id for the whole run (0, 1, 2, …), shared by every "
                "message kind; do not reset it on retry; resend a failed (non-200) append with the same seqno."))
    return out


def _cause(f: HttpFailure) -> str:
    if f.grpc and (f.status is None or 200 <= f.status < 300):
        return ERROR_FIX.get(f.grpc, DEFAULT_FIX)
    return http_cause(f.status, content_type=f.content_type, enveloped=looks_enveloped(f.raw) if f.raw else None,
                      transport=f.transport)


def _resent_ok(ctx: Context, f: HttpFailure) -> bool:
    """A later append of the same message under the same seqno that was not refused: a retry that worked."""
    mine = next((a for a in ctx.facts.appends if a.seq == f.seq), None)
    if mine is None:
        return False
    return any(a.seq > f.seq and a.seqno == mine.seqno and a.request_id == mine.request_id and a.digest == mine.digest
               and a.seq not in ctx.facts.http_failures for a in ctx.facts.appends)


@rule("append_rejected", "error", "a BidiAppend answered non-2xx and never accepted: the server never took its message")
def append_rejected(ctx: Context) -> list[Finding]:
    groups: dict[tuple[str, str | None], list[HttpFailure]] = {}
    for f in sorted(ctx.facts.http_failures.values(), key=lambda f: f.seq):
        if f.transport == "bidi_append" and (f.status or f.grpc) and not _resent_ok(ctx, f):
            groups.setdefault((f.label, f.content_type), []).append(f)
    out = []
    for (label, ctype), fails in groups.items():
        if all(f.kind == kinds.CLIENT_HEARTBEAT for f in fails):
            # Heartbeats carry nothing the run needs: refused alone they harm nobody (typically one
            # in flight as the run ended, answered 404 once the server had let the stream go).
            continue
        head = fails[0]
        carried_kinds: dict[str, int] = {}
        for f in fails:
            carried_kinds[f.kind] = carried_kinds.get(f.kind, 0) + 1
        carried = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in carried_kinds.items())
        seqno = f" (append_seqno {head.seqno})" if head.seqno is not None else ""
        ct = f" as {ctype}" if ctype else ""
        msg = (f"{len(fails)} BidiAppend{'s' if len(fails) != 1 else ''}{ct} answered {label}; the first, at "
               f"seq {head.seq}{seqno}, carried {head.kind}" + (f" (all carried: {carried})" if len(fails) > 1 else "")
               + f". The server never took {'them' if len(fails) > 1 else 'it'}. Likely cause: {_cause(head)}.")
        if head.error_text:
            msg += f" The answer said: {head.error_text[:200]!r}."
        ev = [s for f in fails for s in (f.seq, f.error_seq) if s is not None]
        out.append(ctx.finding(
            "append_rejected", msg, ev,
            "Fix the request as the cause says, then resend the message with the same append_seqno; until it is "
            "accepted the run waits for it (a rejected run_request means the run never starts)."))
    return out


@rule("unary_error", "error", "a unary call answered HTTP >= 400 or a non-zero gRPC status")
def unary_error(ctx: Context) -> list[Finding]:
    info = ctx.session
    facts = ctx.facts
    if info.get("transport") != "unary" and not (facts.kinds and set(facts.kinds) <= {"unary", kinds.HTTP_ERROR, kinds.EMPTY}
                                                 and facts.http_errors):
        return []
    status = info.get("http_status") if isinstance(info.get("http_status"), int) else None
    fails = [f for f in facts.http_failures.values() if f.transport == "unary"]
    if status is None and fails:
        status = fails[0].status
    errors = [e for e in facts.end_streams if kinds.is_end_stream_error(e.kind)]
    grpc = _grpc_status(info)
    text = next((e.text for e in facts.http_errors if e.text), None)
    failed_http = status is not None and status >= 400
    if not (failed_http or errors or grpc or facts.http_errors):
        return []
    path = info.get("path") or "the unary call"
    bits = []
    code = None
    if failed_http or facts.http_errors:
        bits.append(text or f"HTTP {status}")
    if errors:
        err = ctx.stream_error(errors[0])
        if err is not None:
            code = err.code
            bits.append(f"{err.code}" + (f" {err.message!r}" if err.message else ""))
    elif grpc:
        code = grpc[0]
        bits.append(f"{grpc[0]}" + (f" {grpc[1]!r}" if grpc[1] else ""))
    cause = http_cause(status, content_type=fails[0].content_type if fails else None, transport="unary") \
        if failed_http else (ERROR_FIX.get(code or "", DEFAULT_FIX))
    ev = [f.seq for f in fails] + [e.seq for e in facts.http_errors] + [e.seq for e in errors]
    if not ev and facts.last_seq is not None:
        ev = [facts.last_seq]
    return [ctx.finding(
        "unary_error",
        f"{path} was answered {'; '.join(bits)}. Likely cause: {cause}",
        ev,
        ERROR_FIX.get(code or "", "Fix what the status names; a client that needs this call (model listing, "
                      "config) cannot go on without it."))]


def _grpc_status(info: SessionRecord) -> tuple[str, str] | None:
    """(code, message) from a gRPC status the session record kept (trailers or error text)."""
    meta = info.get("meta") or {}
    trailers = meta.get("trailers") if isinstance(meta, dict) else None
    if isinstance(trailers, dict) and (code := grpc_code_name(trailers.get("grpc-status"))):
        return code, str(trailers.get("grpc-message") or "")
    err = str(info.get("error") or "")
    if err.startswith("grpc-status "):
        num, _, message = err[len("grpc-status "):].partition(" ")
        if (code := grpc_code_name(num)):
            return code, message.strip()
    return None


def _interval_s(ctx: Context) -> tuple[float, str]:
    """The client's heartbeat interval: the median gap between its heartbeats before the end (in time
    order) once it left at least two, else the usual interval of real clients. Not the server's
    heartbeat spacing, which says nothing about when the client sends; and not a single gap, which
    may be two heartbeats that left together (a queue flushed under load)."""
    f = ctx.facts
    end = f.end_streams[-1].ts if f.end_streams else None
    hb = sorted(t for t in f.client_hb_ts if end is None or t <= end)
    gaps = [(b - a) / 1e6 for a, b in zip(hb, hb[1:], strict=False) if b > a]
    if len(gaps) >= 2:
        return statistics.median(gaps), "the client's heartbeat interval"
    return ctx.config.heartbeat_interval_s, "the usual heartbeat interval"


@rule("end_stream_not_delivered", "warning", "the client kept sending long after the server ended the stream")
def end_stream_not_delivered(ctx: Context) -> list[Finding]:
    """Client frames more than one heartbeat interval after the server's end-stream: the client
    never saw the end. Needs per-frame timing, so imports without it are not judged.

    A frame the client sent just before the end reached it is recorded up to one round trip after
    the end (the end travels to the client, the frame back to whatever records). That allowance is
    measured on the session itself: its slowest KV answer, which costs the client no work. Without
    it a heartbeat in flight through a loaded proxy reads as late once the client beats faster than
    the path's round trip."""
    f = ctx.facts
    if not f.end_streams or not f.after_end or ctx.order != ORDER_TIME or ctx.session.get("transport") == "unary":
        return []
    end = f.end_streams[-1]
    interval, what = _interval_s(ctx)
    trip_s = f.kv_round_trip_us / 1e6
    late = [(s, t, k) for s, t, k in f.after_end if t - end.ts > (interval + trip_s) * 1e6]
    if not late:
        return []
    last_seq, last_ts, _k = f.after_end[-1]
    turn = [s for s, _g in f.turn_ended if s < end.seq]
    after_turn = f" after turn_ended at seq {turn[-1]}" if turn else ""
    sent = sorted({k for _s, _t, k in f.after_end})
    return [ctx.finding(
        "end_stream_not_delivered",
        f"the server ended the stream at seq {end.seq}{after_turn}, but the client kept sending: "
        f"{f.after_end_count} frame(s) ({', '.join(sent[:4])}), the last at seq {last_seq} "
        f"{(last_ts - end.ts) / 1e6:.1f} s later, more than {what} ({interval:.1f} s)"
        + (f" plus the slowest KV round trip of the session ({trip_s:.1f} s)" if trip_s >= 0.05 else "")
        + ". The client evidently never saw the end of the response.",
        [end.seq] + ([turn[-1]] if turn else []) + [s for s, _t, _k in late[:5]] + [last_seq],
        "Something on the path held back the end of the response (END_STREAM / the last chunk): typically a proxy "
        "or MITM that forwards the response end only once the request side is done, or that buffers the response "
        "body. Forward the response end as soon as it arrives (stream both directions); a client can also treat "
        "turn_ended, or the end-stream frame itself, as the end instead of waiting for the connection.")]


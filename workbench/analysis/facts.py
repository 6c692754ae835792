"""One pass over a session's frames, in seq order, collecting what the rules and tables need.

This is the only place that walks frames. It is streaming on purpose: the batch analysis feeds a
whole session (in Arrow batches), the live analysis feeds new rows as a capture grows, and both
end in the same ``SessionFacts``. The walk is cheap for the bulk (token/thinking/tool-call deltas,
heartbeats: a dict lookup and a few assignments); protobuf parsing happens only for the frames
that carry something to correlate (tool calls, exec, KV, checkpoints, run requests, end-streams).

Answers are paired with their requests by id, not by position: an answer that precedes its
request (a session imported in body order, where all client frames of a Run come first) is kept
until the request arrives, then counted as its answer. That pairing (exec, KV, interaction
queries) lives in ``pairing.py``, mixed into ``FactsBuilder``.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import MethodType
from typing import Any, cast

import pyarrow as pa
from google.protobuf.message import DecodeError

from workbench.analysis.exchanges import error_code, meta_fields
from workbench.analysis.pairing import CLIENT_CLS as CLIENT_CLS
from workbench.analysis.pairing import SERVER_CLS as SERVER_CLS
from workbench.analysis.pairing import RequestPairing
from workbench.analysis.records import (
    Append,
    CallState,
    EndStream,
    ExecReq,
    HeartbeatRun,
    HttpError,
    HttpFailure,
    KvOp,
    Malformed,
    Query,
    RunRequest,
    SessionFacts,
)
from workbench.protocol.args import accumulate_args_text
from workbench.protocol.kinds import (
    CHECKPOINT,
    CLIENT_HEARTBEAT,
    CONVERSATION_ACTION,
    EMPTY,
    END_STREAM,
    END_STREAM_ERROR,
    EXEC_ABORT,
    EXEC_CLIENT,
    EXEC_CLIENT_CONTROL,
    EXEC_SERVER,
    EXEC_THROW,
    HEARTBEAT,
    HTTP_ERROR,
    INTERACTION_QUERY,
    INTERACTION_RESPONSE,
    KV_CLIENT,
    KV_SERVER,
    MALFORMED,
    RUN_REQUEST,
    STEP_COMPLETED,
    STEP_STARTED,
    SUMMARY,
    SUMMARY_COMPLETED,
    SUMMARY_STARTED,
    TEXT_DELTA,
    THINKING_COMPLETED,
    THINKING_DELTA,
    TOKEN_DELTA,
    TURN_ENDED,
    USER_MESSAGE_APPENDED,
    is_end_stream,
)
from workbench.protocol.kinds import PARTIAL_TOOL_CALL as PARTIAL
from workbench.protocol.kinds import TOOL_CALL_COMPLETED as COMPLETED
from workbench.protocol.kinds import TOOL_CALL_DELTA as TOOL_DELTA
from workbench.protocol.kinds import TOOL_CALL_STARTED as STARTED
from workbench.protocol.run_request import run_request_facts
from workbench.protocol.status import grpc_code_name, status_in_text

NDJSON = "cli_ndjson"
CANCEL_ACTION = f"{CONVERSATION_ACTION}.cancel_action"  # the client asks the server to stop the run

# Kinds whose payload the walk parses; the batch query fetches payload bytes for these only
# (and for every BidiAppend, whose duplicates are compared by content).
PAYLOAD_KINDS = (PARTIAL, STARTED, COMPLETED, CHECKPOINT, RUN_REQUEST, END_STREAM_ERROR, EXEC_THROW, MALFORMED)
PAYLOAD_PREFIXES = (EXEC_SERVER, EXEC_CLIENT, KV_SERVER, KV_CLIENT, INTERACTION_RESPONSE, CONVERSATION_ACTION)
# Frames the batch walk skips: SQL aggregates stand in for them (see walk.load_facts).
# (Client heartbeats stay in the walk: as BidiAppends they carry append_seqno.)
BULK_KINDS = (HEARTBEAT, TEXT_DELTA, TOOL_DELTA, TOKEN_DELTA, THINKING_DELTA)
# Server frames that show the model produced something new: a run that sends one of these after
# an obligation has moved past it.
GEN_KINDS = frozenset({TEXT_DELTA, TOKEN_DELTA, THINKING_DELTA, THINKING_COMPLETED, STEP_STARTED, STEP_COMPLETED,
                       TURN_ENDED, SUMMARY, SUMMARY_STARTED, SUMMARY_COMPLETED, USER_MESSAGE_APPENDED, CHECKPOINT})
GEN_BULK_KINDS = (TEXT_DELTA, TOKEN_DELTA, THINKING_DELTA)
# Server frames that are not progress of any kind (KV traffic is housekeeping, not progress).
_NOT_PROGRESS_PREFIXES = (END_STREAM, KV_SERVER, HTTP_ERROR, MALFORMED)
# Heartbeat stretches shorter than this are not worth remembering (rules use larger thresholds).
_MIN_RUN_KEPT = 2
_RUN_SAMPLE = 20
_AFTER_END_KEPT = 32
_CLIENT_HB_KEPT = 100_000

FRAME_FIELDS = ("seq", "ts_us", "direction", "transport", "kind", "ref_id", "call_id", "append_seqno",
                "request_id", "flags", "payload", "decoded", "http_status", "content_type", "error", "raw",
                "grpc_status")


def is_new_input(kind: str) -> bool:
    """Client messages that ask the server for new work (exec results are judged per exec)."""
    return kind == RUN_REQUEST or kind.startswith("conversation_action")


def _ok_status(status: int | None) -> bool:
    return status is None or 200 <= status < 300


# The columns ``feed_columns`` reads when the rows carry them, in the order it unpacks them.
_OPTIONAL_COLUMNS = ("transport", "ref_id", "call_id", "payload", "append_seqno", "request_id", "decoded",
                     "http_status", "content_type", "error", "raw", "grpc_status")


class FactsBuilder(RequestPairing):
    """Feed frame rows in seq order; ``facts`` is always current."""

    def __init__(self, session_id: str, *, layout: bool = False) -> None:
        self.facts = SessionFacts(session_id)
        # Batch mode (layout=True) walks only the non-bulk frames and remembers where client and
        # server frames sit, so heartbeat stretches can be rebuilt from the heartbeat seqs alone.
        self.layout = layout
        self.neutral_seqs: list[int] = []       # client frames and empty polls: do not break a stretch
        self.input_seqs: list[int] = []         # new client input (see is_new_input, first exec results)
        self.server_kind_at: dict[int, str] = {}  # walked server frames (not heartbeats)
        # kind -> the handler's function (called with the builder), not a bound method: a table of
        # bound methods held by the builder puts it in a reference cycle, so the whole walk's facts
        # (some 70,000 objects at 1M frames) outlived the analysis until the cyclic collector's next
        # pass, which then had them all to traverse (a tenth of a 1M-frame diagnose).
        self._handlers: dict[str, Callable[..., None] | None] = {}
        self._exec_open: dict[tuple[int, int], ExecReq] = {}
        self._kv_open: dict[tuple[int, int], KvOp] = {}
        self._query_open: dict[tuple[int, int], Query] = {}
        # answers whose request has not been seen (yet): (what, seg, id) -> handler calls to replay
        self._early: dict[tuple[str, int, int], list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        # requests still waiting for an answer, to count later server frames (live grace)
        self._waiting: list[ExecReq | KvOp | Query] = []

    # input ------------------------------------------------------------------------------------

    def feed_table(self, table: pa.Table) -> None:
        # Only the columns the walk reads: a live page of full rows also carries summary/raw/decoded.
        cols = {name: table.column(name).to_pylist() for name in table.column_names
                if name in FRAME_FIELDS or name in ("ts", "meta")}
        if "ts_us" not in cols and "ts" in cols:
            cols["ts_us"] = [_to_us(v) for v in cols["ts"]]
        self._meta_columns(cols, table.num_rows)
        self.feed_columns(cols, table.num_rows)

    def feed_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        cols: dict[str, list[Any]] = {}
        for name in FRAME_FIELDS:
            if name == "ts_us":
                cols[name] = [_to_us(r["ts_us"]) if "ts_us" in r else _to_us(r.get("ts")) for r in rows]
            else:
                cols[name] = [r.get(name) for r in rows]
        if any(r.get("http_status") is None and r.get("meta") is not None for r in rows):
            cols["meta"] = [r.get("meta") for r in rows]
            cols.pop("http_status")
        self._meta_columns(cols, len(rows))
        self.feed_columns(cols, len(rows))

    @staticmethod
    def _meta_columns(cols: dict[str, list[Any]], n: int) -> None:
        """Full frame rows carry ``meta``; the walk wants http_status / content_type columns."""
        if "http_status" in cols or "meta" not in cols:
            return
        statuses: list[int | None] = [None] * n
        ctypes: list[str | None] = [None] * n
        grpcs: list[int | None] = [None] * n
        transports = cols.get("transport") or [None] * n
        directions = cols.get("direction") or [None] * n
        for i, meta in enumerate(cols["meta"]):
            if meta is not None and transports[i] in ("bidi_append", "unary") and directions[i] == "client":
                statuses[i], ctypes[i], grpcs[i] = meta_fields(meta)
        cols["http_status"] = statuses
        cols["content_type"] = ctypes
        cols["grpc_status"] = grpcs

    def feed_columns(self, cols: Mapping[str, Sequence[Any]], n: int) -> None:
        if not n:
            return
        f = self.facts
        seqs = cols["seq"]
        tss = cols["ts_us"]
        dirs = cols["direction"]
        kinds = cols["kind"]
        none = [None] * n  # a column the rows do not carry: None in every row
        (transports, refs, cids, payloads, seqnos, rids, decodeds, statuses, ctypes, errors, raws,
         grpcs) = (cols.get(name) or none for name in _OPTIONAL_COLUMNS)
        flags = cols.get("flags") or [0] * n
        handlers = self._handlers
        end_stream = cast(MethodType, self._on_end_stream).__func__
        kind_counts = f.kinds
        layout = self.layout
        if f.first_seq is None:
            f.first_seq = seqs[0]
        for i in range(n):
            kind = kinds[i]
            seq = seqs[i]
            ts = tss[i]
            kind_counts[kind] = kind_counts.get(kind, 0) + 1
            if dirs[i] == "server":
                if kind == EMPTY:
                    if layout:
                        self.neutral_seqs.append(seq)
                    continue  # an empty RunPoll answer: neither progress nor a heartbeat
                if layout and kind != HEARTBEAT:
                    self.server_kind_at[seq] = kind
                if kind == HEARTBEAT:
                    self._heartbeat(seq, ts)
                    continue
                if f.open_run is not None:
                    self._close_run(seq, kind)
                if not is_end_stream(kind):
                    f.last_server_seq = seq
                    f.last_server_kind = kind
                    f.last_progress_seq = seq
                    f.last_progress_ts = ts
                if not kind.startswith(_NOT_PROGRESS_PREFIXES):
                    f.seg_last_any[f.seg] = seq
                    if kind in GEN_KINDS:
                        f.seg_last_gen[f.seg] = seq
                if kind == HTTP_ERROR:
                    text = str(errors[i] or "HTTP error")
                    f.http_errors.append(HttpError(seq, transports[i] or "", text, rids[i], seqnos[i],
                                                   status_in_text(text)))
                if self._waiting:
                    self._tick()
            else:
                self._client_frame(seq, ts, kind, transports[i], payloads[i], seqnos[i], rids[i], statuses[i],
                                   ctypes[i], raws[i], grpcs[i])
            if transports[i] == NDJSON:
                f.ndjson.append((seq, kind, payloads[i], decodeds[i]))
                continue
            if kind == MALFORMED:
                f.malformed.append(seq)
                f.malformed_frames.append(Malformed(seq, ts, dirs[i] or "", transports[i] or "", payloads[i] or b"",
                                                    str(errors[i] or "")))
                continue
            if kind in handlers:
                h = handlers[kind]
            else:
                bound = self._handler_for(kind)
                h = handlers[kind] = cast(MethodType, bound).__func__ if bound is not None else None
            if h is not None:
                if h is end_stream and transports[i] == "bidi_append":
                    # the answer to one BidiAppend (a gRPC-Web trailer, a Connect error), not the run's end
                    if kind == END_STREAM_ERROR:
                        f.http_errors.append(HttpError(seq, "bidi_append", "", rids[i], seqnos[i], None,
                                                       error_code(payloads[i] or b"", flags[i] or 0)))
                    continue
                if h is end_stream:
                    f.end_streams.append(EndStream(seq, ts, kind, payloads[i] or b"", flags[i] or 0))
                    f.after_end = []
                    f.after_end_count = 0
                    continue
                h(self, seq, ts, refs[i], cids[i], payloads[i], kind)
        f.frame_count += n
        f.last_seq = seqs[n - 1]
        f.last_ts = tss[n - 1]

    # bookkeeping ------------------------------------------------------------------------------

    def _heartbeat(self, seq: int, ts: int) -> None:
        f = self.facts
        f.heartbeat_seqs.append(seq)
        run = f.open_run
        if run is None:
            f.open_run = HeartbeatRun(seq, seq, 1, ts, ts, f.seg, [seq], f.last_progress_seq,
                                      f.last_server_kind, f.last_client_seq)
        else:
            run.last_seq = seq
            run.last_ts = ts
            run.count += 1
            if run.count <= _RUN_SAMPLE:
                run.sample.append(seq)
        f.last_server_seq = seq
        if self._waiting:
            self._tick()

    def _client_frame(self, seq: int, ts: int, kind: str, transport: str | None, payload: bytes | None,
                      seqno: int | None, rid: str | None, status: int | None, ctype: str | None,
                      raw: bytes | None, grpc_status: int | None = None) -> None:
        f = self.facts
        if self.layout:
            self.neutral_seqs.append(seq)
        if transport == "bidi_append" and seqno is not None:
            f.appends.append(Append(seq, rid, seqno, kind, hash(payload) if payload is not None else None, status))
        if not _ok_status(status) or grpc_status:
            f.http_failures[seq] = HttpFailure(seq, transport or "", kind, status, ctype, rid, seqno,
                                               raw=raw if raw is not None else payload,
                                               grpc=grpc_code_name(grpc_status) if grpc_status else None)
        if kind == CLIENT_HEARTBEAT:
            if len(f.client_hb_ts) < _CLIENT_HB_KEPT:
                f.client_hb_ts.append(ts)
        elif is_new_input(kind):
            self._input(seq)
            if payload:
                f.client_payloads.append((seq, payload))
            if kind == CANCEL_ACTION:
                f.cancels.append((seq, ts, f.seg))
        if f.end_streams and kind != RUN_REQUEST and (not f.seg_starts or f.seg_starts[-1] < f.end_streams[-1].seq):
            f.after_end_count += 1
            if len(f.after_end) < _AFTER_END_KEPT:
                f.after_end.append((seq, ts, kind))
            else:
                f.after_end[-1] = (seq, ts, kind)

    def _input(self, seq: int) -> None:
        f = self.facts
        if f.last_client_seq is None or seq > f.last_client_seq:
            f.last_client_seq = seq
        if self.layout:
            if not self.input_seqs or seq > self.input_seqs[-1]:
                self.input_seqs.append(seq)
            else:
                insort(self.input_seqs, seq)

    def _close_run(self, next_seq: int | None, next_kind: str | None) -> None:
        run = self.facts.open_run
        self.facts.open_run = None
        if run is None or run.count < _MIN_RUN_KEPT:
            return
        run.next_seq = next_seq
        run.next_kind = next_kind
        if run.sample[-1] != run.last_seq:
            run.sample.append(run.last_seq)
        self.facts.runs.append(run)

    def all_runs(self) -> list[HeartbeatRun]:
        """Closed stretches plus the one still running (its next_seq is None)."""
        runs = list(self.facts.runs)
        run = self.facts.open_run
        if run is not None and run.count >= _MIN_RUN_KEPT:
            tail = HeartbeatRun(run.first_seq, run.last_seq, run.count, run.first_ts, run.last_ts, run.seg,
                                list(run.sample), run.prev_seq, run.prev_kind, run.prev_client_seq)
            if tail.sample[-1] != tail.last_seq:
                tail.sample.append(tail.last_seq)
            runs.append(tail)
        return runs

    def _handler_for(self, kind: str) -> Callable[[int, int, Any, Any, Any, str], None] | None:
        if kind == TEXT_DELTA:
            return self._on_text
        if kind == TURN_ENDED:
            return self._on_turn_ended
        if kind in (PARTIAL, STARTED, COMPLETED):
            return self._on_call_update
        if kind == TOOL_DELTA:
            return self._on_tool_delta
        if kind == CHECKPOINT:
            return self._on_checkpoint
        if kind == RUN_REQUEST:
            return self._on_run_request
        if is_end_stream(kind):
            return self._on_end_stream
        if kind.startswith(f"{EXEC_SERVER}."):
            return self._on_exec
        if kind.startswith(EXEC_CLIENT):
            return self._on_exec_result
        if kind.startswith(f"{EXEC_CLIENT_CONTROL}."):
            return self._on_exec_control
        if kind == EXEC_ABORT:
            return self._on_abort
        if kind.startswith(f"{KV_SERVER}."):
            return self._on_kv
        if kind.startswith(f"{KV_CLIENT}."):
            return self._on_kv_result
        if kind.startswith(INTERACTION_QUERY):
            return self._on_query
        if kind.startswith(INTERACTION_RESPONSE):
            return self._on_response
        return None

    # handlers ---------------------------------------------------------------------------------

    def _on_text(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        self.facts.text_seqs.append(seq)

    def _on_end_stream(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        pass  # recorded by the loop, which has the flags

    def _on_turn_ended(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        self.facts.turn_ended.append((seq, self.facts.seg))
        self.facts.turn_ended_ts[seq] = ts

    def _call(self, call_id: str, seq: int, ts: int) -> CallState:
        st = self.facts.calls.get(call_id)
        if st is None:
            st = self.facts.calls[call_id] = CallState(call_id, seq, seq, ts, ts, self.facts.seg)
        else:
            st.last_seq = seq
            st.last_ts = ts
        return st

    def _on_tool_delta(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        if cid:
            self._call(cid, seq, ts).delta_count += 1

    def _on_call_update(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        if not payload:
            return
        try:
            upd = SERVER_CLS.FromString(payload).interaction_update
        except DecodeError:
            return
        member = upd.WhichOneof("message")
        if member is None:  # the kind came from another schema (a user's --proto) that numbers it differently
            return
        inner = getattr(upd, member)
        call_id = inner.call_id or cid or f"?{seq}"
        st = self._call(call_id, seq, ts)
        if member == "partial_tool_call":
            st.model_call_id = st.model_call_id or inner.model_call_id or None
            delta = inner.args_text_delta
            if delta:
                st.deltas.append(delta)
                st.delta_seqs.append(seq)
                st.args_text = accumulate_args_text(st.args_text, delta)
        else:
            st.model_call_id = st.model_call_id or inner.model_call_id or None
            if member == "tool_call_started":
                st.started_seq = seq
                st.started_payload = payload
            else:
                st.completed_seq = seq
                st.completed_payload = payload
        if inner.HasField("tool_call"):
            case = inner.tool_call.WhichOneof("tool")
            if case:
                st.tool_case = case

    def _on_checkpoint(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        self.facts.checkpoints.append((seq, self.facts.seg, payload or b""))

    def _on_run_request(self, seq: int, ts: int, ref: Any, cid: Any, payload: Any, kind: str) -> None:
        f = self.facts
        f.seg += 1
        f.seg_starts.append(seq)
        rr = run_request_facts(kind, payload, CLIENT_CLS)
        if rr is None:
            return
        f.run_requests.append(RunRequest(seq, f.seg, rr.has_state, rr.state_empty, rr.conversation_id or "",
                                         rr.action, payload or b"", rr.prompt, ts))


def _to_us(v: Any) -> int:
    if v is None:
        return 0
    if isinstance(v, int):
        return v
    if isinstance(v, datetime):
        epoch = datetime(1970, 1, 1, tzinfo=v.tzinfo)
        delta = v - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(v)

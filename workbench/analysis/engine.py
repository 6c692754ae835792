"""Running the analysis: one session from a store or reader, many sessions into the store, or a
capture in progress fed row by row.

A stored session is walked in slices over the frames that carry something to correlate, with
payload bytes only for the kinds the walk parses (``facts.PAYLOAD_KINDS``); the bulk (token,
thinking, text and tool-call deltas, heartbeats) is summarised in SQL (``_aggregates``), so a
million-frame session never turns into a million Python objects.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from workbench.analysis.blobs import blob_rows
from workbench.analysis.bridge import bridge_findings
from workbench.analysis.bridge_join import store_links
from workbench.analysis.causes import order_findings
from workbench.analysis.exchanges import link_http_errors
from workbench.analysis.facts import (
    BULK_KINDS,
    GEN_BULK_KINDS,
    HEARTBEAT,
    RUN_REQUEST,
    TEXT_DELTA,
    TOOL_DELTA,
    FactsBuilder,
    payload_sql_predicate,
)
from workbench.analysis.model import AnalysisResult, Config, Finding
from workbench.analysis.records import CallState, HeartbeatRun, SessionFacts
from workbench.analysis.rules import Context, run_rules
from workbench.analysis.stamp import mark_analysed
from workbench.analysis.tools import public_row, tool_rows
from workbench.protocol import kinds
from workbench.protocol.run_request import run_request_facts
from workbench.schema import pb
from workbench.store.db import Store

_SLICE = 200_000


class Queryable(Protocol):
    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...


# Facts of the exchange that carried a client frame (frames.meta): its HTTP status and content type.
_EXCHANGE = "transport IN ('bidi_append', 'unary') AND direction = 'client' AND meta IS NOT NULL"
_STATUS = "TRY_CAST(json_extract(meta, '$.http_status') AS INTEGER)"


def frames_sql(bulk: bool = True) -> str:
    skip = "" if bulk else f" AND kind NOT IN ({', '.join(repr(k) for k in BULK_KINDS)})"
    return (
        "SELECT seq, epoch_us(ts) AS ts_us, direction, transport, kind, ref_id, call_id, append_seqno, "
        f"request_id, flags, CASE WHEN {payload_sql_predicate()} THEN payload END AS payload, "
        "CASE WHEN transport = 'cli_ndjson' THEN decoded END AS decoded, "
        f"CASE WHEN {_EXCHANGE} THEN {_STATUS} END AS http_status, "
        f"CASE WHEN {_EXCHANGE} THEN coalesce(json_extract_string(meta, '$.content_type'), "
        "json_extract_string(meta, '$.request_headers.\"content-type\"')) END AS content_type, "
        f"CASE WHEN kind = '{kinds.HTTP_ERROR}' THEN coalesce(error, summary) END AS error, "
        f"CASE WHEN {_EXCHANGE} AND NOT coalesce({_STATUS} BETWEEN 200 AND 299, true) THEN raw END AS raw, "
        f"CASE WHEN {_EXCHANGE} THEN TRY_CAST(json_extract(meta, '$.grpc_status') AS INTEGER) END AS grpc_status "
        f"FROM frames WHERE session_id = ? AND seq >= ? AND seq < ?{skip} ORDER BY seq"
    )


_PROGRESS = (f"direction = 'server' AND kind NOT IN {kinds.sql_list((kinds.SERVER_HEARTBEAT, kinds.EMPTY))} "
             f"AND NOT starts_with(kind, '{kinds.END_STREAM}')")


def _stretches(builder: FactsBuilder, hb_seqs: list[int], hb_ts: list[int], lo: int, hi: int,
               min_run: int) -> list[HeartbeatRun]:
    """Heartbeat stretches from the heartbeat seqs and the walk's layout. Seqs are dense (0, 1, 2, …
    per session), so two heartbeats belong to one stretch exactly when every frame between them is
    a client frame (or an empty poll): the walk saw all of those, and any other frame in the gap is
    a server frame that breaks the stretch."""
    neutral = builder.neutral_seqs
    neutral_set = set(neutral)
    runs: list[HeartbeatRun] = []
    n = len(hb_seqs)
    i = 0
    while i < n:
        j = i
        while j + 1 < n:
            a, b = hb_seqs[j], hb_seqs[j + 1]
            gap = b - a - 1
            if gap and bisect_left(neutral, b) - bisect_right(neutral, a) != gap:
                break
            j += 1
        if j - i + 1 >= min_run:
            first, last = hb_seqs[i], hb_seqs[j]
            prev = first - 1
            while prev >= lo and prev in neutral_set:
                prev -= 1
            nxt = last + 1
            while nxt <= hi and nxt in neutral_set:
                nxt += 1
            sample = hb_seqs[i:min(j + 1, i + 20)]
            if sample[-1] != last:
                sample.append(last)
            k = bisect_left(builder.input_seqs, first)
            runs.append(HeartbeatRun(first, last, j - i + 1, hb_ts[i], hb_ts[j], 0, sample,
                                     prev if prev >= lo else None, None,
                                     builder.input_seqs[k - 1] if k else None,
                                     nxt if nxt <= hi else None, None))
        i = j + 1
    return runs


def _aggregates(src: Queryable, session_id: str, builder: FactsBuilder, min_run: int) -> None:
    """What the batch walk skipped: heartbeat stretches, text seqs, tool_call_delta counts, bounds."""
    f = builder.facts
    b = src.query(
        "SELECT count(*) AS n, min(seq) AS first_seq, max(seq) AS last_seq, arg_max(epoch_us(ts), seq) AS last_ts, "
        f"max(seq) FILTER (WHERE direction = 'server' AND NOT starts_with(kind, '{kinds.END_STREAM}')) AS last_server_seq, "
        f"arg_max(kind, seq) FILTER (WHERE {_PROGRESS}) AS lk, "
        f"max(seq) FILTER (WHERE {_PROGRESS}) AS lp, "
        f"arg_max(epoch_us(ts), seq) FILTER (WHERE {_PROGRESS}) AS lpt "
        "FROM frames WHERE session_id = ?", [session_id]).to_pylist()[0]
    f.frame_count = int(b["n"])
    f.first_seq, f.last_seq, f.last_ts = b["first_seq"], b["last_seq"], b["last_ts"]
    f.last_server_seq, f.last_server_kind = b["last_server_seq"], b["lk"]
    f.last_progress_seq, f.last_progress_ts = b["lp"], b["lpt"]
    marks = src.query("SELECT seq, epoch_us(ts) AS ts_us, kind = ? AS hb FROM frames WHERE session_id = ? "
                      "AND direction = 'server' AND kind IN (?, ?) ORDER BY seq",
                      [HEARTBEAT, session_id, HEARTBEAT, TEXT_DELTA])
    hb_mask = marks.column("hb")
    hbs = marks.filter(hb_mask)
    f.heartbeat_seqs = hbs.column("seq").to_pylist()
    f.text_seqs = marks.filter(pc.invert(hb_mask)).column("seq").to_pylist()
    runs = _stretches(builder, f.heartbeat_seqs, hbs.column("ts_us").to_pylist(), f.first_seq, f.last_seq,
                      max(1, min_run))
    unknown = sorted({s for r in runs for s in (r.prev_seq, r.next_seq)
                      if s is not None and s not in builder.server_kind_at})
    kind_at = dict(builder.server_kind_at.items()) if not unknown else {**builder.server_kind_at, **{
        r["seq"]: r["kind"] for r in src.query(
            "SELECT seq, kind FROM frames WHERE session_id = ? AND seq IN (SELECT unnest(?))",
            [session_id, unknown]).to_pylist()}}
    for r in runs:
        r.prev_kind = kind_at.get(r.prev_seq) if r.prev_seq is not None else None
        r.next_kind = kind_at.get(r.next_seq) if r.next_seq is not None else None
        r.seg = sum(1 for rr in f.run_requests if rr.seq < r.first_seq)
    f.runs = runs
    for r in src.query("SELECT call_id, count(*) AS n, max(seq) AS last_seq, min(seq) AS first_seq, "
                       "max(epoch_us(ts)) AS last_ts, min(epoch_us(ts)) AS first_ts FROM frames "
                       "WHERE session_id = ? AND kind = ? AND call_id IS NOT NULL GROUP BY call_id",
                       [session_id, TOOL_DELTA]).to_pylist():
        st = f.calls.get(r["call_id"])
        if st is None:
            st = f.calls[r["call_id"]] = CallState(r["call_id"], r["first_seq"], r["last_seq"], r["first_ts"],
                                                   r["last_ts"], 0)
        st.delta_count += r["n"]
        if r["last_seq"] > st.last_seq:
            st.last_seq, st.last_ts = r["last_seq"], r["last_ts"]
        if r["first_seq"] < st.first_seq:
            st.first_seq, st.first_ts = r["first_seq"], r["first_ts"]
    kt = src.query("SELECT kind, count(*) AS n FROM frames WHERE session_id = ? GROUP BY kind", [session_id])
    f.kinds = dict(zip(kt.column(0).to_pylist(), kt.column(1).to_pylist(), strict=True))
    _bulk_progress(src, session_id, f)


def _bulk_progress(src: Queryable, session_id: str, f: SessionFacts) -> None:
    """The walk skipped the bulk deltas: fold the last of them per segment into the progress marks."""
    bulk = [k for k in BULK_KINDS if k != HEARTBEAT]
    if not any(f.kinds.get(k) for k in bulk):
        return
    marks = ", ".join(repr(k) for k in bulk)
    gen = ", ".join(repr(k) for k in GEN_BULK_KINDS)
    rows = src.query(
        "SELECT coalesce(s.seg, 0) AS seg, max(f.seq) AS any_seq, max(f.seq) FILTER (WHERE f.kind IN "
        f"({gen})) AS gen_seq FROM (SELECT seq, kind FROM frames WHERE session_id = ? AND direction = 'server' "
        f"AND kind IN ({marks})) f ASOF LEFT JOIN (SELECT unnest(?) AS b, generate_subscripts(?, 1) AS seg) s "
        "ON f.seq >= s.b GROUP BY ALL", [session_id, f.seg_starts, f.seg_starts]).to_pylist()
    for r in rows:
        seg = int(r["seg"])
        for target, value in ((f.seg_last_any, r["any_seq"]), (f.seg_last_gen, r["gen_seq"])):
            if value is not None and value > target.get(seg, -1):
                target[seg] = int(value)


def _is_live(src: Any) -> bool:
    return bool(getattr(src, "live", False))


def session_row(src: Queryable, session_id: str) -> dict[str, Any]:
    """The session record the rules read (``meta`` parsed from its JSON)."""
    t = src.query("SELECT status, error, conversation_id, source, transport, path, http_status, "
                  "CAST(meta AS VARCHAR) AS meta FROM sessions WHERE session_id = ?", [session_id])
    if not t.num_rows:
        return {}
    row = t.to_pylist()[0]
    try:
        meta = json.loads(row["meta"]) if row.get("meta") else {}
    except ValueError:
        meta = {}
    row["meta"] = meta if isinstance(meta, dict) else {}
    return row


def session_final(src: Queryable, session_id: str) -> bool:
    """Is the session over? A capture in progress (read live) with status 'open' is not."""
    status = session_row(src, session_id).get("status")
    return not (status == "open" and _is_live(src))


def load_facts(src: Queryable, session_id: str, config: Config | None = None) -> FactsBuilder:
    """Facts of a stored session: a Python walk over the frames that carry something to correlate,
    SQL aggregates for the bulk (deltas, heartbeats)."""
    cfg = config or Config()
    builder = FactsBuilder(session_id, layout=True)
    bounds = src.query("SELECT min(seq), max(seq) FROM frames WHERE session_id = ?", [session_id])
    lo, hi = bounds.column(0)[0].as_py(), bounds.column(1)[0].as_py()
    if lo is None:
        return builder
    sql = frames_sql(bulk=False)
    start = lo
    while start <= hi:
        table = src.query(sql, [session_id, start, start + _SLICE])
        builder.feed_table(table)
        start += _SLICE
    _aggregates(src, session_id, builder, cfg.heartbeat_min_count)
    return builder


def analyze_session(store_or_reader: Queryable, session_id: str, config: Config | None = None, *,
                    final: bool | None = None) -> AnalysisResult:
    """Analyse one stored session (read only: nothing is written)."""
    src = store_or_reader
    cfg = config or Config()
    info = session_row(src, session_id)
    if final is None:
        final = not (info.get("status") == "open" and _is_live(src))
    builder = load_facts(src, session_id, cfg)
    facts = builder.facts
    conv = _conversation_id(src, facts)
    siblings = _siblings(src, session_id, conv) if conv else []
    known = _known_blob_ids(src, siblings)
    prior = _prior_checkpoint(src, session_id, siblings)
    prompt = _first_prompt(src, prior[0]) if prior else None
    result = evaluate(builder, cfg, final=final, known_ids=known, prior_checkpoint=prior, session=info,
                      prior_prompt=prompt, later_payloads=_later_payloads(src, session_id))
    # the two sides of a bridge (analysis/bridge.py): findings that need the other side's session
    result.findings = sort_findings(result.findings + bridge_findings(src, session_id))
    return result


def evaluate(builder: FactsBuilder, cfg: Config, *, final: bool, known_ids: Iterable[bytes] = (),
             prior_checkpoint: tuple[str, int] | None = None,
             session: Mapping[str, Any] | None = None,
             blob_cache: dict[bytes, dict[str, Any]] | None = None,
             prior_prompt: str | None = None,
             later_payloads: Callable[[], list[tuple[str, int, bytes]]] | None = None) -> AnalysisResult:
    facts = builder.facts
    link_http_errors(facts)
    blobs = blob_rows(facts, final=final, grace=cfg.live_grace_frames, known_ids=known_ids, cache=blob_cache)
    calls = tool_rows(facts)
    runs = [r for r in builder.all_runs() if r.count >= cfg.heartbeat_min_count]
    ctx = Context(facts, blobs, calls, cfg, final, runs, prior_checkpoint,
                  {"session": dict(session or {}), "prior_prompt": prior_prompt,
                   "later_payloads": later_payloads or (lambda: [])})
    findings = sort_findings(run_rules(ctx))
    return AnalysisResult(facts.session_id, blobs, [public_row(r) for r in calls], findings, facts.frame_count)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Root causes first, each followed by the findings that follow from it (``causes``)."""
    return order_findings(findings)


# cross-session context ----------------------------------------------------------------------------

def _conversation_id(src: Queryable, facts: SessionFacts) -> str | None:
    for rr in facts.run_requests:
        if rr.conversation_id:
            return rr.conversation_id
    t = src.query("SELECT conversation_id FROM sessions WHERE session_id = ?", [facts.session_id])
    return t.column(0)[0].as_py() if t.num_rows else None


def _siblings(src: Queryable, session_id: str, conversation_id: str) -> list[tuple[str, Any]]:
    """Other sessions of the same conversation, with their start time."""
    t = src.query("SELECT session_id, started_at FROM sessions WHERE conversation_id = ? AND session_id <> ?",
                  [conversation_id, session_id])
    out = {r["session_id"]: r["started_at"] for r in t.to_pylist()}
    # Sessions whose recorder did not fill conversation_id: look at their run requests.
    t = src.query("SELECT f.session_id, f.payload, s.started_at FROM frames f JOIN sessions s USING (session_id) "
                  "WHERE f.kind = ? AND f.session_id <> ? AND s.conversation_id IS NULL", [kinds.RUN_REQUEST, session_id])
    for r in t.to_pylist():
        rr = run_request_facts(kinds.RUN_REQUEST, r["payload"])
        if rr is not None and rr.conversation_id == conversation_id:
            out[r["session_id"]] = r["started_at"]
    return sorted(out.items(), key=lambda kv: (kv[1] is None, kv[1]))


def _known_blob_ids(src: Queryable, siblings: list[tuple[str, Any]]) -> set[bytes]:
    if not siblings:
        return set()
    ids = [s for s, _ in siblings]
    t = src.query("SELECT payload FROM frames WHERE session_id IN (SELECT unnest(?)) AND kind = ?",
                  [ids, kinds.KV_SET_BLOB_ARGS])
    out: set[bytes] = set()
    for payload in t.column(0).to_pylist():
        try:
            out.add(bytes(pb.AgentServerMessage.FromString(payload or b"").kv_server_message.set_blob_args.blob_id))
        except DecodeError:
            continue
    return out


def _prior_checkpoint(src: Queryable, session_id: str, siblings: list[tuple[str, Any]]) -> tuple[str, int] | None:
    if not siblings:
        return None
    t = src.query("SELECT started_at FROM sessions WHERE session_id = ?", [session_id])
    mine = t.column(0)[0].as_py() if t.num_rows else None
    earlier = [s for s, started in siblings if mine is None or started is None or started < mine]
    if not earlier:
        return None
    t = src.query("SELECT session_id, max(seq) AS seq FROM frames WHERE session_id IN (SELECT unnest(?)) "
                  "AND kind = 'conversation_checkpoint_update' GROUP BY session_id", [earlier])
    rows = t.to_pylist()
    if not rows:
        return None
    return rows[-1]["session_id"], int(rows[-1]["seq"])


_LATER_LIMIT = 200


def _later_payloads(src: Queryable, session_id: str) -> Callable[[], list[tuple[str, int, bytes]]]:
    """Run requests and conversation actions of sessions that started later (the next turns, where
    a client replays a call's args in its history), fetched once and only when a rule asks."""
    memo: list[list[tuple[str, int, bytes]]] = []

    def get() -> list[tuple[str, int, bytes]]:
        if not memo:
            t = src.query(
                "SELECT f.session_id, f.seq, f.payload FROM frames f JOIN sessions s USING (session_id) "
                "WHERE s.started_at > (SELECT started_at FROM sessions WHERE session_id = ?) "
                f"AND f.direction = 'client' AND (f.kind = '{kinds.RUN_REQUEST}' "
                f"OR starts_with(f.kind, '{kinds.CONVERSATION_ACTION}')) "
                f"AND f.payload IS NOT NULL ORDER BY s.started_at, f.session_id, f.seq LIMIT {_LATER_LIMIT}",
                [session_id])
            memo.append([(r["session_id"], int(r["seq"]), bytes(r["payload"])) for r in t.to_pylist()])
        return memo[0]

    return get


def _first_prompt(src: Queryable, session_id: str) -> str | None:
    """The user text of a session's first run_request (a stateless client's history shows there)."""
    t = src.query("SELECT payload FROM frames WHERE session_id = ? AND kind = ? ORDER BY seq LIMIT 1",
                  [session_id, RUN_REQUEST])
    if not t.num_rows:
        return None
    try:
        um = pb.AgentClientMessage.FromString(t.column(0)[0].as_py() or b"").run_request.action.user_message_action
    except DecodeError:
        return None
    return um.user_message.text or um.user_message.rich_text or None


# writing -----------------------------------------------------------------------------------------

def analyze(store: Store, session_ids: list[str] | None = None, config: Config | None = None
            ) -> dict[str, AnalysisResult]:
    """Analyse sessions (all when None) and replace their rows in blobs, tool_calls and findings."""
    if session_ids is None:
        session_ids = [str(s) for s in store.query("SELECT session_id FROM sessions ORDER BY started_at, session_id")
                       .column(0).to_pylist()]
    results = {sid: analyze_session(store, sid, config) for sid in session_ids}
    write_results(store, list(results.values()))
    return results


BLOB_TYPES: list[tuple[str, pa.DataType]] = [
    ("session_id", pa.string()), ("blob_id", pa.string()), ("op", pa.string()), ("seq", pa.int64()),
    ("result_seq", pa.int64()), ("kv_id", pa.int64()), ("size", pa.int32()), ("content_type", pa.string()),
    ("role", pa.string()), ("proto_type", pa.string()), ("parts", pa.string()), ("sha256_ok", pa.bool_()),
    ("checkpoint_ref", pa.string()), ("status", pa.string()), ("preview", pa.string()), ("data", pa.binary()),
]
TOOL_TYPES: list[tuple[str, pa.DataType]] = [
    ("session_id", pa.string()), ("call_id", pa.string()), ("tool_name", pa.string()), ("exec_id", pa.int64()),
    ("model_call_id", pa.string()), ("first_seq", pa.int64()), ("last_seq", pa.int64()), ("exec_seq", pa.int64()),
    ("result_seq", pa.int64()), ("args_streamed", pa.string()), ("args_completion", pa.string()),
    ("args_merged", pa.string()), ("args_naive", pa.string()), ("result", pa.string()), ("status", pa.string()),
    ("started_at", pa.timestamp("us")), ("ended_at", pa.timestamp("us")),
]
FINDING_TYPES: list[tuple[str, pa.DataType]] = [
    ("session_id", pa.string()), ("code", pa.string()), ("severity", pa.string()), ("message", pa.string()),
    ("first_seq", pa.int64()), ("last_seq", pa.int64()), ("evidence", pa.list_(pa.int64())),
    ("suggested_fix", pa.string()),
]
_JSON_COLS = {"parts", "args_streamed", "args_completion", "args_merged", "result"}


def _to_arrow(rows: list[Mapping[str, Any]], types: list[tuple[str, pa.DataType]]) -> pa.Table:
    arrays = []
    for name, typ in types:
        values: list[Any] = [r.get(name) for r in rows]
        if name in _JSON_COLS:
            # Rows of one blob share their parts object: serialise each object once.
            memo: dict[int, str] = {}
            out: list[str | None] = []
            for v in values:
                if v is None:
                    out.append(None)
                    continue
                key = id(v)
                text = memo.get(key)
                if text is None:
                    text = memo[key] = json.dumps(v, default=str, ensure_ascii=False)
                out.append(text)
            values = out
        arrays.append(pa.array(values, type=typ))
    return pa.Table.from_arrays(arrays, schema=pa.schema(types))


def result_tables(results: list[AnalysisResult]) -> dict[str, pa.Table]:
    return {
        "blobs": _to_arrow([b for r in results for b in r.blobs], BLOB_TYPES),
        "tool_calls": _to_arrow([t for r in results for t in r.tool_calls], TOOL_TYPES),
        "findings": _to_arrow([f.as_dict() for r in results for f in r.findings], FINDING_TYPES),
    }


def write_results(store: Store, results: list[AnalysisResult]) -> None:
    """Replace the sessions' rows and stamp them analysed (``stamp``: clean is not "never analysed")."""
    ids = [r.session_id for r in results]
    if not ids:
        return
    for table, rows in result_tables(results).items():
        store.insert_rows(table, rows, replace_sessions=ids)
    store_links(store, ids)  # the two sides of a bridge, linked (analysis/bridge_join.py)
    mark_analysed(store, ids)


# live ----------------------------------------------------------------------------------------------

class IncrementalAnalyzer:
    """Findings for a capture in progress: ``feed`` new frame rows (in seq order), ask ``findings``.

    Rows are an Arrow table or dicts with the ``frames`` columns (``ts`` as a datetime or ``ts_us``
    as epoch microseconds). Rows at or below the last seq fed are ignored, so a follower can
    re-send an overlapping page safely. Until ``final`` is set, rules wait
    ``Config.live_grace_frames`` frames before calling a request unanswered and never call a
    stream ended.
    """

    def __init__(self, session_id: str, config: Config | None = None) -> None:
        self.session_id = session_id
        self.config = config or Config()
        self.builder = FactsBuilder(session_id)
        self.final = False
        self._blob_cache: dict[bytes, dict[str, Any]] = {}  # blob contents described once per capture

    @property
    def last_seq(self) -> int | None:
        return self.builder.facts.last_seq

    def feed(self, rows: pa.Table | Iterable[Mapping[str, Any]]) -> int:
        """Add frames; returns how many were new."""
        last = self.last_seq
        if isinstance(rows, pa.Table):
            if "session_id" in rows.column_names:
                rows = rows.filter(pc.equal(rows.column("session_id"), self.session_id))
            if last is not None:
                rows = rows.filter(pc.greater(rows.column("seq"), last))
            if rows.num_rows:
                rows = rows.sort_by("seq")
                self.builder.feed_table(rows)
            return int(rows.num_rows)
        fresh = [r for r in rows if r.get("session_id", self.session_id) == self.session_id
                 and (last is None or r["seq"] > last)]
        fresh.sort(key=lambda r: r["seq"])
        self.builder.feed_rows(fresh)
        return len(fresh)

    def result(self, final: bool | None = None) -> AnalysisResult:
        return evaluate(self.builder, self.config, final=self.final if final is None else final,
                        blob_cache=self._blob_cache)

    def findings(self, final: bool | None = None) -> list[Finding]:
        return self.result(final).findings

"""Running the analysis: one session from a store or reader, many sessions into the store, or a
capture in progress fed row by row.

A stored session is walked in slices over the frames that carry something to correlate, with
payload bytes only for the kinds the walk parses (``facts.PAYLOAD_KINDS``); the bulk (token,
thinking, text and tool-call deltas, heartbeats) is summarised in SQL (``_aggregates``), so a
million-frame session never turns into a million Python objects.
"""

from __future__ import annotations

import gc
import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from workbench.analysis.blobs import blob_rows
from workbench.analysis.bridge import bridge_findings
from workbench.analysis.bridge_join import store_links
from workbench.analysis.causes import order_findings
from workbench.analysis.conversations import Conversations
from workbench.analysis.exchanges import link_http_errors
from workbench.analysis.facts import (
    BULK_KINDS,
    GEN_BULK_KINDS,
    HEARTBEAT,
    NDJSON,
    PAYLOAD_KINDS,
    PAYLOAD_PREFIXES,
    RUN_REQUEST,
    TEXT_DELTA,
    TOOL_DELTA,
    FactsBuilder,
)
from workbench.analysis.model import AnalysisResult, Config, Finding
from workbench.analysis.records import CallState, HeartbeatRun, SessionFacts
from workbench.analysis.rows import BlobContent, SessionRecord
from workbench.analysis.rules import Context, run_rules
from workbench.analysis.stamp import mark_analysed
from workbench.analysis.tools import public_row, tool_rows
from workbench.schema import pb
from workbench.store import analysis_reads as reads
from workbench.store import queries
from workbench.store.db import Store
from workbench.store.queries import Reader

_SLICE = 200_000


# The walk reads every frame but the bulk, with the payloads the facts builder parses.
WALK = reads.WalkSpec(skip_kinds=BULK_KINDS, payload_kinds=PAYLOAD_KINDS, payload_prefixes=PAYLOAD_PREFIXES,
                      payload_transports=(NDJSON, "bidi_append"))


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


class _Bulk(NamedTuple):
    """The aggregate reads of a session, independent of the walk (read while it runs)."""

    tallies: pa.Table
    marks: pa.Table
    spans: pa.Table
    kinds: dict[str, int]
    bulk_seqs: pa.Table


def _bulk_reads(src: Reader, session_id: str) -> _Bulk:
    return _Bulk(reads.frame_tallies(src, session_id), reads.server_marks(src, session_id, HEARTBEAT, TEXT_DELTA),
                 reads.call_spans(src, session_id, TOOL_DELTA), queries.kind_counts(src, session_id),
                 reads.server_seqs_of(src, session_id, [k for k in BULK_KINDS if k != HEARTBEAT], GEN_BULK_KINDS))


def _aggregates(src: Reader, session_id: str, builder: FactsBuilder, min_run: int, bulk: _Bulk) -> None:
    """What the batch walk skipped: heartbeat stretches, text seqs, tool_call_delta counts, bounds."""
    f = builder.facts
    b = bulk.tallies.to_pylist()[0]
    f.frame_count = int(b["n"])
    f.first_seq, f.last_seq, f.last_ts = b["first_seq"], b["last_seq"], b["last_ts"]
    f.last_server_seq, f.last_server_kind = b["last_server_seq"], b["lk"]
    f.last_progress_seq, f.last_progress_ts = b["lp"], b["lpt"]
    marks = bulk.marks
    hb_mask = marks.column("hb")
    hbs = marks.filter(hb_mask)
    f.heartbeat_seqs = hbs.column("seq").to_pylist()
    f.text_seqs = marks.filter(pc.invert(hb_mask)).column("seq").to_pylist()
    runs = _stretches(builder, f.heartbeat_seqs, hbs.column("ts_us").to_pylist(), f.first_seq, f.last_seq,
                      max(1, min_run))
    unknown = sorted({s for r in runs for s in (r.prev_seq, r.next_seq)
                      if s is not None and s not in builder.server_kind_at})
    kind_at = dict(builder.server_kind_at.items()) if not unknown else {
        **builder.server_kind_at, **reads.kinds_at(src, session_id, unknown)}
    for r in runs:
        r.prev_kind = kind_at.get(r.prev_seq) if r.prev_seq is not None else None
        r.next_kind = kind_at.get(r.next_seq) if r.next_seq is not None else None
        r.seg = sum(1 for rr in f.run_requests if rr.seq < r.first_seq)
    f.runs = runs
    for r in bulk.spans.to_pylist():
        st = f.calls.get(r["call_id"])
        if st is None:
            st = f.calls[r["call_id"]] = CallState(r["call_id"], r["first_seq"], r["last_seq"], r["first_ts"],
                                                   r["last_ts"], 0)
        st.delta_count += r["n"]
        if r["last_seq"] > st.last_seq:
            st.last_seq, st.last_ts = r["last_seq"], r["last_ts"]
        if r["first_seq"] < st.first_seq:
            st.first_seq, st.first_ts = r["first_seq"], r["first_ts"]
    f.kinds = dict(bulk.kinds)
    _bulk_progress(bulk.bulk_seqs, f)


def _bulk_progress(t: pa.Table, f: SessionFacts) -> None:
    """The walk skipped the bulk deltas (``t``: their seqs, ``gen`` flags): fold the last of them per
    segment into the progress marks."""
    if not t.num_rows:
        return
    # numpy over the seqs: an ASOF join against the segment starts cost several times the scan
    seqs = _ints(t, "seq", np.int64)
    gen = seqs[_ints(t, "gen", np.int8).astype(bool)]
    for target, values in ((f.seg_last_any, seqs), (f.seg_last_gen, gen)):
        for seg, value in _last_per_segment(np.sort(values, kind="stable"), f.seg_starts).items():
            if value > target.get(seg, -1):
                target[seg] = value


def _last_per_segment(seqs: np.ndarray, starts: Sequence[int]) -> dict[int, int]:
    """Segment → its highest seq among ``seqs`` (sorted). Segment 0 is before ``starts[0]``, segment k
    from ``starts[k-1]`` to ``starts[k]`` (the run_request seqs, ascending)."""
    cuts = np.searchsorted(seqs, np.asarray(starts, dtype=np.int64), side="left").tolist()
    out: dict[int, int] = {}
    begin = 0
    for seg, end in enumerate([*cuts, len(seqs)]):
        if end > begin:
            out[seg] = int(seqs[end - 1])
        begin = max(begin, end)
    return out


def _ints(table: pa.Table, name: str, dtype: type[np.generic]) -> np.ndarray:
    """A fixed-width, non-null Arrow column as numpy, read from its buffers (``to_numpy`` makes
    pyarrow import pandas, a quarter of a second)."""
    size = np.dtype(dtype).itemsize
    parts = [np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * size)
             for c in table.column(name).chunks if len(c)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _is_live(src: Any) -> bool:
    return bool(getattr(src, "live", False))


def session_row(src: Reader, session_id: str) -> SessionRecord:
    """The session record the rules read (``meta`` parsed from its JSON)."""
    t = reads.session_record(src, session_id)
    if not t.num_rows:
        return SessionRecord()
    row = t.to_pylist()[0]
    try:
        meta = json.loads(row["meta"]) if row.get("meta") else {}
    except ValueError:
        meta = {}
    row["meta"] = meta if isinstance(meta, dict) else {}
    return cast(SessionRecord, row)


def session_final(src: Reader, session_id: str) -> bool:
    """Is the session over? A capture in progress (read live) with status 'open' is not."""
    status = session_row(src, session_id).get("status")
    return not (status == "open" and _is_live(src))


def load_facts(src: Reader, session_id: str, config: Config | None = None) -> FactsBuilder:
    """Facts of a stored session: a Python walk over the frames that carry something to correlate,
    SQL aggregates for the bulk (deltas, heartbeats)."""
    cfg = config or Config()
    builder = FactsBuilder(session_id, layout=True)
    lo, hi = reads.seq_bounds(src, session_id)
    if lo is None or hi is None:
        return builder
    # DuckDB runs without the GIL: one thread reads the next slice (then the aggregates) while this
    # one walks the current slice in Python. One slice ahead at most, so memory stays one slice.
    # The reader is used by one thread at a time: the walk itself makes no query.
    starts = list(range(lo, hi + 1, _SLICE))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="analysis-read") as pool:
        ahead = pool.submit(reads.walk_frames, src, session_id, starts[0], starts[0] + _SLICE, WALK)
        for nxt in starts[1:]:
            table = ahead.result()
            ahead = pool.submit(reads.walk_frames, src, session_id, nxt, nxt + _SLICE, WALK)
            builder.feed_table(table)
        table = ahead.result()
        aggregates = pool.submit(_bulk_reads, src, session_id)
        builder.feed_table(table)
        bulk = aggregates.result()
    _aggregates(src, session_id, builder, cfg.heartbeat_min_count, bulk)
    return builder


def analyze_session(store_or_reader: Reader, session_id: str, config: Config | None = None, *,
                    final: bool | None = None, conversations: Conversations | None = None) -> AnalysisResult:
    """Analyse one stored session (read only: nothing is written). ``conversations``: shared by the
    sessions of one batch, so each reads its siblings once (``analysis.conversations``)."""
    with collector_paused():
        return _analyze_session(store_or_reader, session_id, config, final, conversations)


def _analyze_session(src: Reader, session_id: str, config: Config | None, final: bool | None,
                     conversations: Conversations | None) -> AnalysisResult:
    cfg = config or Config()
    info = session_row(src, session_id)
    if final is None:
        final = not (info.get("status") == "open" and _is_live(src))
    builder = load_facts(src, session_id, cfg)
    facts = builder.facts
    conv = _conversation_id(src, facts)
    known: Container[bytes] = ()
    prior = None
    if conv:
        convs = conversations or Conversations(src)
        known = convs.known_blob_ids(conv, session_id)
        prior = convs.prior_checkpoint(session_id, conv, reads.started_at(src, session_id))
    prompt = _first_prompt(src, prior[0]) if prior else None
    result = evaluate(builder, cfg, final=final, known_ids=known, prior_checkpoint=prior, session=info,
                      prior_prompt=prompt, later_payloads=_later_payloads(src, session_id))
    # the two sides of a bridge (analysis/bridge.py): findings that need the other side's session
    result.findings = sort_findings(result.findings + bridge_findings(src, session_id))
    return result


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused: the analysis of a session allocates some 100,000
    objects that all stay alive until it ends, and the collector scanned them again and again for
    nothing (a fifth of the time of a 1M-frame diagnose). Process-wide, so restored on exit; an
    analysis running meanwhile on another thread at worst runs with it on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def evaluate(builder: FactsBuilder, cfg: Config, *, final: bool, known_ids: Container[bytes] = (),
             prior_checkpoint: tuple[str, int] | None = None,
             session: SessionRecord | None = None,
             blob_cache: dict[bytes, BlobContent] | None = None,
             prior_prompt: str | None = None,
             later_payloads: Callable[[], list[tuple[str, int, bytes]]] | None = None) -> AnalysisResult:
    facts = builder.facts
    link_http_errors(facts)
    blobs = blob_rows(facts, final=final, grace=cfg.live_grace_frames, known_ids=known_ids, cache=blob_cache)
    calls = tool_rows(facts)
    runs = [r for r in builder.all_runs() if r.count >= cfg.heartbeat_min_count]
    ctx = Context(facts, blobs, calls, cfg, final, runs, prior_checkpoint, session or SessionRecord(),
                  prior_prompt, later_payloads)
    findings = sort_findings(run_rules(ctx))
    return AnalysisResult(facts.session_id, blobs, [public_row(r) for r in calls], findings, facts.frame_count)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Root causes first, each followed by the findings that follow from it (``causes``)."""
    return order_findings(findings)


# cross-session context ----------------------------------------------------------------------------

def _conversation_id(src: Reader, facts: SessionFacts) -> str | None:
    for rr in facts.run_requests:
        if rr.conversation_id:
            return rr.conversation_id
    return reads.conversation_of(src, facts.session_id)


_LATER_LIMIT = 200


def _later_payloads(src: Reader, session_id: str) -> Callable[[], list[tuple[str, int, bytes]]]:
    """Run requests and conversation actions of sessions that started later (the next turns, where
    a client replays a call's args in its history), fetched once and only when a rule asks."""
    memo: list[list[tuple[str, int, bytes]]] = []

    def get() -> list[tuple[str, int, bytes]]:
        if not memo:
            memo.append(reads.later_client_inputs(src, session_id, _LATER_LIMIT))
        return memo[0]

    return get


def _first_prompt(src: Reader, session_id: str) -> str | None:
    """The user text of a session's first run_request (a stateless client's history shows there)."""
    payload = reads.first_payload(src, session_id, RUN_REQUEST)
    if payload is None:
        return None
    try:
        um = pb.AgentClientMessage.FromString(payload).run_request.action.user_message_action
    except DecodeError:
        return None
    return um.user_message.text or um.user_message.rich_text or None


# writing -----------------------------------------------------------------------------------------

def analyze(store: Store, session_ids: list[str] | None = None, config: Config | None = None
            ) -> dict[str, AnalysisResult]:
    """Analyse sessions (all when None) and replace their rows in blobs, tool_calls and findings."""
    if session_ids is None:
        session_ids = reads.session_ids(store)
    convs = Conversations(store)
    results = {sid: analyze_session(store, sid, config, conversations=convs) for sid in session_ids}
    write_results(store, list(results.values()))
    return results


# The columns of the derived tables the analysis writes (DuckDB casts each list to its column).
BLOB_COLUMNS = ("session_id", "blob_id", "op", "seq", "result_seq", "kv_id", "size", "content_type", "role",
                "proto_type", "parts", "sha256_ok", "checkpoint_ref", "status", "preview", "data")
TOOL_COLUMNS = ("session_id", "call_id", "tool_name", "exec_id", "model_call_id", "first_seq", "last_seq",
                "exec_seq", "result_seq", "args_streamed", "args_completion", "args_merged", "args_naive", "result",
                "status", "started_at", "ended_at")
FINDING_COLUMNS = ("session_id", "code", "severity", "message", "first_seq", "last_seq", "evidence", "suggested_fix")
_JSON_COLS = {"parts", "args_streamed", "args_completion", "args_merged", "result"}
_JSON = json.JSONEncoder(default=str, ensure_ascii=False)


def _columns(rows: Sequence[Mapping[str, object]], names: Sequence[str]) -> dict[str, list[Any]]:
    """One list of Python values per column; JSON columns as text."""
    out: dict[str, list[Any]] = {}
    for name in names:
        values: list[Any] = [r[name] for r in rows]  # every row has every column (typed rows)
        if name in _JSON_COLS:
            # Rows of one blob share their parts object: serialise each object once.
            memo: dict[int, str] = {}
            texts: list[str | None] = []
            for v in values:
                if v is None:
                    texts.append(None)
                    continue
                text = memo.get(id(v))
                if text is None:
                    text = memo[id(v)] = _JSON.encode(v)
                texts.append(text)
            values = texts
        out[name] = values
    return out


def result_columns(results: list[AnalysisResult]) -> dict[str, dict[str, list[Any]]]:
    """The rows of ``blobs``, ``tool_calls`` and ``findings`` for these results, column by column."""
    return {
        "blobs": _columns([b for r in results for b in r.blobs], BLOB_COLUMNS),
        "tool_calls": _columns([t for r in results for t in r.tool_calls], TOOL_COLUMNS),
        "findings": _columns([f.to_json() for r in results for f in r.findings], FINDING_COLUMNS),
    }


def write_results(store: Store, results: list[AnalysisResult]) -> None:
    """Replace the sessions' rows and stamp them analysed (``stamp``: clean is not "never analysed")."""
    ids = [r.session_id for r in results]
    if not ids:
        return
    with collector_paused():
        tables = result_columns(results)
    with store.transaction():  # one commit: the rows and their stamp land together or not at all
        for table, columns in tables.items():
            reads.replace_rows(store, table, ids, columns)
        mark_analysed(store, ids)
    store_links(store, ids)  # the two sides of a bridge, linked (analysis/bridge_join.py)


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
        self._blob_cache: dict[bytes, BlobContent] = {}  # blob contents described once per capture

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

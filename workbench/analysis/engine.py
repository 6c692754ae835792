"""Running the analysis: one session from a store or reader, many sessions into the store, or a
capture in progress fed row by row.

A stored session's facts come from the walk (``walk.load_facts``: slices over the frames that carry
something to correlate, SQL aggregates for the bulk); the rules run on them here, with the bridge
rules (``bridge``) for a session on either side of a bridge.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from workbench.analysis.blobs import blob_rows
from workbench.analysis.bridge import any_bridge_sessions, bridge_findings
from workbench.analysis.bridge_handoff import calls_answered_in_follow_up
from workbench.analysis.bridge_join import store_links
from workbench.analysis.causes import order_findings
from workbench.analysis.conversations import Conversations
from workbench.analysis.exchanges import link_http_errors
from workbench.analysis.facts import RUN_REQUEST, FactsBuilder
from workbench.analysis.inputs import Inputs
from workbench.analysis.model import AnalysisResult, Config, Finding
from workbench.analysis.records import SessionFacts
from workbench.analysis.rows import BlobContent, SessionRecord
from workbench.analysis.rules import Context, run_rules
from workbench.analysis.stamp import mark_analysed
from workbench.analysis.tools import public_row, tool_rows
from workbench.analysis.walk import load_facts
from workbench.schema import pb
from workbench.store import analysis_reads as reads
from workbench.store.db import Store
from workbench.store.queries import Reader


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


def analyze_session(store_or_reader: Reader, session_id: str, config: Config | None = None, *,
                    final: bool | None = None, conversations: Conversations | None = None,
                    inputs: Inputs | None = None) -> AnalysisResult:
    """Analyse one stored session (read only: nothing is written). ``conversations``: shared by the
    sessions of one batch, so each reads its siblings once (``analysis.conversations``). ``inputs``:
    filled with what the analysis read of other sessions (``analysis.inputs``)."""
    with collector_paused():
        return _analyze_session(store_or_reader, session_id, config, final, conversations, inputs)


def _analyze_session(src: Reader, session_id: str, config: Config | None, final: bool | None,
                     conversations: Conversations | None, inputs: Inputs | None = None) -> AnalysisResult:
    cfg = config or Config()
    info = session_row(src, session_id)
    if final is None:
        final = not (info.get("status") == "open" and _is_live(src))
    builder = load_facts(src, session_id, cfg)
    facts = builder.facts
    conv = _conversation_id(src, facts)
    known: Container[bytes] = ()
    prior = None
    convs = conversations or Conversations(src)
    seen = inputs if inputs is not None else Inputs()
    seen.conversation = conv
    if conv:
        known = seen.watch_blobs(convs.known_blob_ids(conv, session_id)) if inputs is not None \
            else convs.known_blob_ids(conv, session_id)
        prior = prior_of(src, convs, session_id, conv, seen)
    prompt = _first_prompt(src, prior[0]) if prior else None
    seen.prior, seen.prompt = prior, prompt
    later = _later_payloads(src, session_id)
    seen.alone = conv is not None and not convs.siblings(session_id, conv)
    # the two sides of a bridge (analysis/bridge.py): findings that need the other side's session
    if convs.bridged is None:  # read once per batch, like the conversations
        convs.bridged = any_bridge_sessions(src)
    seen.bridged = convs.bridged
    follow_ups = _follow_ups(src, session_id) if convs.bridged else None
    result = evaluate(builder, cfg, final=final, known_ids=known, prior_checkpoint=prior, session=info,
                      prior_prompt=prompt, later_payloads=seen.watch_later(later) if inputs is not None else later,
                      follow_ups=follow_ups, alone=seen.alone)
    result.findings = sort_findings(result.findings + bridge_findings(src, session_id, bridged=convs.bridged))
    return result


def prior_of(src: Reader, convs: Conversations, session_id: str, conv: str, seen: Inputs) -> tuple[str, int] | None:
    """The checkpoint of an earlier session of the conversation (``Conversations.prior_checkpoint``)."""
    if not convs.siblings(session_id, conv):  # alone in its conversation: no earlier checkpoint to look for
        return None
    if seen.started is None:
        seen.started = reads.started_at(src, session_id)
    return convs.prior_checkpoint(session_id, conv, seen.started)


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
             later_payloads: Callable[[], list[tuple[str, int, bytes]]] | None = None,
             follow_ups: Callable[[], set[str]] | None = None,
             alone: bool = False) -> AnalysisResult:
    facts = builder.facts
    link_http_errors(facts)
    blobs = blob_rows(facts, final=final, grace=cfg.live_grace_frames, known_ids=known_ids, cache=blob_cache)
    calls = tool_rows(facts)
    runs = [r for r in builder.all_runs() if r.count >= cfg.heartbeat_min_count]
    ctx = Context(facts, blobs, calls, cfg, final, runs, prior_checkpoint, session or SessionRecord(),
                  prior_prompt, later_payloads, follow_ups, alone)
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


LATER_LIMIT = 200


def _later_payloads(src: Reader, session_id: str) -> Callable[[], list[tuple[str, int, bytes]]]:
    """Run requests and conversation actions of sessions that started later (the next turns, where
    a client replays a call's args in its history), fetched once and only when a rule asks."""
    memo: list[list[tuple[str, int, bytes]]] = []

    def get() -> list[tuple[str, int, bytes]]:
        if not memo:
            memo.append(reads.later_client_inputs(src, session_id, LATER_LIMIT))
        return memo[0]

    return get


def _follow_ups(src: Reader, session_id: str) -> Callable[[], set[str]]:
    """The tool-call ids of a run answered in a bridge's follow-up run, read only when a rule asks."""
    def get() -> set[str]:
        try:
            return calls_answered_in_follow_up(src, session_id)
        except Exception:  # a reader of an older or partial database: no hand-off to see
            return set()
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

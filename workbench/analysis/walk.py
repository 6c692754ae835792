"""Facts of a stored session: a walk over the frames that carry something to correlate, SQL
aggregates for the bulk.

The session is walked in slices over those frames, with payload bytes only for the kinds the walk
parses (``facts.PAYLOAD_KINDS``); the bulk (token, thinking, text and tool-call deltas, heartbeats)
is summarised in SQL (``_aggregates``), so a million-frame session never turns into a million
Python objects. The engine evaluates the rules on these facts; the bridge rules (``bridge``) read
the facts of the runs on the agent side through the same walk.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.facts import (
    BULK_KINDS,
    GEN_BULK_KINDS,
    HEARTBEAT,
    NDJSON,
    PAYLOAD_KINDS,
    PAYLOAD_PREFIXES,
    TEXT_DELTA,
    TOOL_DELTA,
    FactsBuilder,
)
from workbench.analysis.model import Config
from workbench.analysis.records import CallState, HeartbeatRun, SessionFacts
from workbench.store import analysis_reads as reads
from workbench.store import queries
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


def _bulk_reads(src: Reader, session_id: str, tallies: pa.Table) -> _Bulk:
    return _Bulk(tallies, reads.server_marks(src, session_id, HEARTBEAT, TEXT_DELTA),
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


def load_facts(src: Reader, session_id: str, config: Config | None = None) -> FactsBuilder:
    """Facts of a stored session: a Python walk over the frames that carry something to correlate,
    SQL aggregates for the bulk (deltas, heartbeats)."""
    cfg = config or Config()
    builder = FactsBuilder(session_id, layout=True)
    # the tallies hold the session's seq bounds: read first, they spare a query of their own
    tallies = reads.frame_tallies(src, session_id)
    bounds = tallies.to_pylist()[0]
    lo, hi = bounds["first_seq"], bounds["last_seq"]
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
        aggregates = pool.submit(_bulk_reads, src, session_id, tallies)
        builder.feed_table(table)
        bulk = aggregates.result()
    if builder.facts.malformed_frames:  # where sync was lost, in bytes (rules_client.framing_lost)
        offsets = reads.body_offsets(src, session_id, [m.seq for m in builder.facts.malformed_frames])
        for m in builder.facts.malformed_frames:
            m.offset = offsets.get(m.seq)
    _aggregates(src, session_id, builder, cfg.heartbeat_min_count, bulk)
    return builder

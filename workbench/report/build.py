"""One session read for the HTML report, in bounded memory and size whatever its length.

``read_for_report`` reads the session's facts and its analysis, then walks its frames once, page by
page and without payloads (``session.frame_lines``), feeding the sequence diagram, the timeline, the
stall watch and the exec tracker, which keep bounded state (runs collapsed, at most
``diagram.MAX_ROWS`` rows). Only the frames of the frame table are read whole: the first
``max_frames`` and every frame the page links to (a diagram row, a finding's evidence, a tool call,
a blob), so every link on the page lands. The frames between are named, with the command that
lists them. The tool-call and blob tables are cut at ``MAX_TABLE_ROWS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis import analyze_session
from workbench.protocol import kinds
from workbench.report.diagram import STREAM_KINDS, Diagram, DiagramBuilder
from workbench.report.session import (
    LinkedFrame,
    LoadedFrame,
    Reader,
    SessionView,
    finding_dict,
    frame_pages,
    hide_content,
    load_links,
    loaded_frames,
    safe_label,
    scrub_text,
    session_facts,
)
from workbench.report.shape import ExecTracker, StallWatch
from workbench.report.timeline import Timeline, TimelineBuilder
from workbench.store import queries

MAX_TABLE_ROWS = 500    # tool calls, blobs: rows shown (the rest counted, with the command that lists them)
MAX_EVIDENCE = 40       # evidence links of one finding (the rest counted)


@dataclass
class Skipped:
    """Frames between two rows of the frame table that it leaves out."""

    first_seq: int
    last_seq: int


@dataclass
class ReportSession:
    view: SessionView                         # ``frames``: the frame table's frames only
    diagram: Diagram
    timeline: Timeline
    frame_count: int
    table: list[LoadedFrame | Skipped] = field(default_factory=list)
    tools_left_out: int = 0
    blobs_left_out: int = 0


def _wanted_by_findings(findings: list[dict[str, Any]]) -> set[int]:
    out: set[int] = set()
    for fd in findings:
        fd["evidence_left_out"] = max(0, len(fd["evidence"]) - MAX_EVIDENCE)
        fd["evidence"] = fd["evidence"][:MAX_EVIDENCE]
        out.update(fd["evidence"])
        for key in ("first_seq", "last_seq"):
            if fd.get(key) is not None:
                out.add(int(fd[key]))
    return out


def _absorbed(kind: str, direction: str) -> bool:
    """A frame the diagram folds into a run with the same frames around it (its row is the run's)."""
    return direction == "server" and (kinds.is_server_heartbeat(kind) or kind in STREAM_KINDS
                                      or kind.startswith(kinds.OPENAI + ".delta."))


def walk(src: Reader, session_id: str, timeline: TimelineBuilder, head: list[int], max_frames: int,
         wanted: np.ndarray, ts_of: dict[int, int]) -> Iterator[LinkedFrame]:
    """The session's frames page by page, as columns: the timeline counts them, ``head`` gets the
    first ``max_frames`` seqs and ``ts_of`` the time of each ``wanted`` seq; what is yielded is one
    item per frame, except that frames alike in a row that the diagram folds into one run (server
    heartbeats, streamed pieces) come as one item with their count, so the Python work is per
    message the diagram tells apart, not per frame."""
    for t in frame_pages(src, session_id):
        seq = t.column("seq").to_numpy()
        ts = t.column("ts_us").fill_null(0).to_numpy()
        kind = pc.dictionary_encode(t.column("kind").fill_null("")).combine_chunks()
        direction = pc.dictionary_encode(t.column("direction").fill_null("")).combine_chunks()
        kidx = kind.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        didx = direction.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        knames: list[str] = kind.dictionary.to_pylist()
        dnames: list[str] = direction.dictionary.to_pylist()
        server = np.array([d == "server" for d in dnames], dtype=bool)[didx]
        timeline.add_page(ts, server, kidx, knames)
        if len(head) < max_frames:
            head += seq[:max_frames - len(head)].tolist()
        if len(wanted):
            hit = np.isin(seq, wanted)
            ts_of.update(zip(seq[hit].tolist(), ts[hit].tolist(), strict=True))
        key = kidx * len(dnames) + didx
        fold = np.array([_absorbed(k, d) for k in knames for d in dnames], dtype=bool)[key]
        n = len(seq)
        starts = np.ones(n, dtype=bool)
        starts[1:] = (key[1:] != key[:-1]) | ~fold[1:] | ~fold[:-1]
        at = np.nonzero(starts)[0]
        ends = np.append(at[1:], n) - 1
        refs = t.column("ref_id").take(pa.array(at)).to_pylist()
        for i, j, ref in zip(at.tolist(), ends.tolist(), refs, strict=True):
            if i == j:
                yield LinkedFrame(int(seq[i]), int(ts[i]), dnames[didx[i]], knames[kidx[i]], ref)
            else:
                yield LinkedFrame(int(seq[i]), int(ts[i]), dnames[didx[i]], knames[kidx[i]], ref, j - i + 1,
                                  int(seq[j]), int(ts[j]))


def read_for_report(src: Reader, session_id: str, *, redact: str = "secrets", max_frames: int = 5000,
                    decoder: Any = None) -> ReportSession:
    """The session as the report shows it (see the module doc)."""
    dec, facts = session_facts(src, session_id, redact, decoder)
    content = redact == "content"
    span = queries.frame_span(src, session_id)
    count = int(span["frames"] or 0)
    t0, t1 = int(span["t0"] or 0), int(span["t1"] or 0)
    view = SessionView(session_id, src.path, facts, [], redact=redact, links=load_links(src, session_id))
    view.span_us = (t0, t1)
    result = analyze_session(src, session_id)
    view.findings = [finding_dict(f) for f in result.findings]
    tools = [dict(c) for c in result.tool_calls]
    blobs = [dict(b) for b in result.blobs]
    view.tool_calls, view.blobs = tools[:MAX_TABLE_ROWS], blobs[:MAX_TABLE_ROWS]
    linked = _wanted_by_findings(view.findings)
    linked.update(int(str(c["first_seq"])) for c in view.tool_calls if c.get("first_seq") is not None)
    linked.update(int(str(b["seq"])) for b in view.blobs if b.get("seq") is not None)

    diagram = DiagramBuilder(t0, facts.get("transport"), view.links)
    timeline = TimelineBuilder(t0, t1)
    stall, execs = StallWatch(), ExecTracker()
    head: list[int] = []
    ts_of: dict[int, int] = {}
    wanted_ts = np.array(sorted(linked), dtype=np.int64)
    for item in walk(src, session_id, timeline, head, max_frames, wanted_ts, ts_of):
        diagram.add(item)
        stall.add(item)
        execs.add(item)
    d = diagram.finish(stall.stall(), execs.execs)
    tl = timeline.finish(view.findings, ts_of)
    linked.update(r.seq for r in d.rows if not r.side and not r.gap)

    wanted = sorted(set(head) | linked)
    hidden: set[str] = set()
    prompt = b""
    for frame, stored in loaded_frames(queries.frames_shown_with_seqs(src, session_id, wanted), dec, content, hidden):
        view.frames.append(frame)
        if frame.kind == kinds.RUN_REQUEST and not prompt:
            prompt = stored
    if content:
        if not prompt:  # the prompt is content whatever the table shows: the label must not quote it
            first = queries.frames_shown_with_seqs(src, session_id, [int(span["first_seq"] or 0)])
            prompt = first[0]["payload"] or b"" if first else b""
        facts["label"] = safe_label(facts.get("label"), prompt)
        for c in tools + blobs:  # what the analysis quotes of tool calls and blobs is content too
            for key in ("args_streamed", "args_completion", "args_merged", "result", "preview"):
                value = c.get(key)
                if isinstance(value, str) and len(value) >= 4:
                    hidden.add(value)
        hide_content(view)
        for fd in view.findings:
            for key in ("message", "suggested_fix"):
                if fd.get(key):
                    fd[key] = scrub_text(str(fd[key]), hidden)
    table: list[LoadedFrame | Skipped] = []
    prev: int | None = None
    for frame in view.frames:
        if prev is not None and frame.seq > prev + 1:
            table.append(Skipped(prev + 1, frame.seq - 1))
        table.append(frame)
        prev = frame.seq
    last_seq = int(span["last_seq"]) if span["last_seq"] is not None else None
    if prev is not None and last_seq is not None and last_seq > prev:
        table.append(Skipped(prev + 1, last_seq))
    return ReportSession(view, d, tl, count, table, len(tools) - len(view.tool_calls), len(blobs) - len(view.blobs))

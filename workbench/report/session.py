"""One stored session read whole for a view that shows it at once (the HTML report, ``workbench diff``).

``load_session`` reads the session row and every frame (payload included), applies the redaction
level asked for (``content`` hides prompts, file contents, commands, tool arguments and results,
KV blobs and the model's text, like ``workbench capture --redact content``: the same
``redact.redact_frame``), and runs the public analysis (``analysis.analyze_session``) for
findings, tool calls and blobs. Trees are decoded lazily (``LoadedFrame.tree``) from the redacted
payload, so content hidden in the payload is hidden in the tree too.

``frame_pages`` reads a session of any size a page at a time without payloads (the report's
pictures, ``build.py``); ``loaded_frames`` turns stored rows into ``LoadedFrame``s, redacted, for
``load_session`` and for the report's frame table (a sample of the session).

``open_source`` turns what a user names on the command line into a reader and a session id: a
session (or a unique prefix) in a capture database, or a replay fixture file, which is read into
a throwaway in-memory database through the same write gate as an import.

``load_links`` reads the other side of a bridge (docs/bridge.md): the OpenAI requests an agent run
is linked to, or the runs an OpenAI request is linked to, each with its role, how it was linked and
its frames' kinds and times (no payloads: the report draws them as arrows, their content stays in
their own reports).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.analysis import analyze_session
from workbench.analysis.bridge_join import listing_links
from workbench.decode import fields_of
from workbench.decode.classify import Frame, default_decoder
from workbench.decode.frame import StoredFrame, stored_meta
from workbench.errors import WorkbenchError
from workbench.fixtures.export import fixture_to_store
from workbench.fixtures.format import load
from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.redact import marker, redact_frame
from workbench.store import bridge_reads, queries
from workbench.store.db import Store
from workbench.store.reader import open_reader

REDACT_LEVELS = ("secrets", "content")
_SCENARIO_LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")


Reader = queries.Reader  # the one reader type (store.queries)


class SessionError(WorkbenchError):
    """A session that cannot be found or read; the message names it and the database or file."""


@dataclass
class LoadedFrame(StoredFrame):
    ref_id: int | None
    call_id: str | None
    error: str | None
    meta: dict[str, Any] | None
    _tree: Any = None
    _decoder: Any = None

    @property
    def tree(self) -> Any:
        """The named tree of the (redacted) payload, decoded on first use."""
        if self._tree is None:

            try:
                self._tree = fields_of(self._decoder, self.kind, self.payload, self.msg_type, self.flags)
            except Exception as exc:  # an undecodable frame is shown with its error, never fatal
                self._tree = {"$error": f"cannot decode frame {self.seq}: {exc}", "$hex": self.payload[:256].hex()}
        return self._tree

    @property
    def family(self) -> str:
        return kinds.family(self.kind)


@dataclass(slots=True)
class LinkedFrame:
    """A frame as the pictures draw it (a linked session's, or one read page by page without its
    payload): when, which way, what kind, and the exec it belongs to."""

    seq: int
    ts_us: int
    direction: str
    kind: str
    ref_id: int | None = None
    # an item standing for ``count`` frames of this kind and direction in a row (a walk of a whole
    # session hands runs over at once): the last one's seq and time
    count: int = 1
    last_seq: int = -1
    last_ts_us: int = 0

    @property
    def end_seq(self) -> int:
        return self.seq if self.count == 1 else self.last_seq

    @property
    def end_ts_us(self) -> int:
        return self.ts_us if self.count == 1 else self.last_ts_us


@dataclass
class LinkedSession:
    """A session on the other side of a bridge, linked to the reported one (``analysis.bridge_join``)."""

    session_id: str
    transport: str
    role: str                     # caused | asked, seen from the OpenAI side
    by: list[str]
    frames: list[LinkedFrame]


@dataclass
class SessionView:
    """A session as a view shows it: facts, frames (redacted), analysis results."""

    session_id: str
    where: str                     # the database or fixture file it came from
    facts: dict[str, Any]
    frames: list[LoadedFrame]
    findings: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    blobs: list[dict[str, Any]] = field(default_factory=list)
    redact: str = "secrets"
    links: list[LinkedSession] = field(default_factory=list)
    span_us: tuple[int, int] | None = None   # first and last frame's time, when ``frames`` is a sample

    @property
    def t0_us(self) -> int:
        if self.span_us is not None:
            return self.span_us[0]
        return self.frames[0].ts_us if self.frames else 0

    @property
    def duration_s(self) -> float:
        if self.span_us is not None:
            return (self.span_us[1] - self.span_us[0]) / 1e6
        return (self.frames[-1].ts_us - self.frames[0].ts_us) / 1e6 if self.frames else 0.0


def _text(value: Any) -> Any:
    """A finding field as plain data: an enum (codes and severities may be typed) as its value."""
    return getattr(value, "value", value)


def finding_dict(f: Any) -> dict[str, Any]:
    """A finding of the public analysis API as a plain dict (whatever class carries it)."""
    names = ("code", "severity", "message", "first_seq", "last_seq", "evidence", "suggested_fix", "cause",
             "cause_seq")
    out = {n: _text(getattr(f, n, None)) for n in names}
    out["evidence"] = [int(s) for s in (out["evidence"] or [])]
    out["is_note"] = out["severity"] not in ("error", "warning")
    return out


def session_facts(src: Reader, session_id: str, redact: str, decoder: Any = None) -> tuple[Any, dict[str, Any]]:
    """The decoder to use and the session's row as a view shows it whole (``SessionError`` for an
    unknown session or redaction level): what the report and the diff read first."""
    if redact not in REDACT_LEVELS:
        raise SessionError(f"--redact {redact!r}: choose one of {', '.join(REDACT_LEVELS)}")
    rows = queries.session_shown_whole(src, session_id)
    if not rows:
        raise SessionError(f"no session {session_id!r} in {src.path}")
    return decoder or default_decoder(), rows[0]


def load_session(src: Reader, session_id: str, *, redact: str = "secrets", decoder: Any = None,
                 analyse: bool = True) -> SessionView:
    """Read one session whole (see the module doc). ``redact``: ``secrets`` or ``content``."""
    dec, facts = session_facts(src, session_id, redact, decoder)
    content = redact == "content"
    frames: list[LoadedFrame] = []
    prompt_bytes = b""
    hidden: set[str] = set()   # strings content redaction took out: a finding must not quote them
    for f, stored in loaded_frames(queries.frames_shown_whole(src, session_id), dec, content, hidden):
        frames.append(f)
        if f.kind == kinds.RUN_REQUEST and not prompt_bytes:
            prompt_bytes = stored
    if content:
        facts["label"] = safe_label(facts.get("label"), prompt_bytes)
        facts["error"] = facts.get("error")  # transport and server errors: codes, no user content
    view = SessionView(session_id, src.path, facts, frames, redact=redact, links=load_links(src, session_id))
    if analyse:

        result = analyze_session(src, session_id)
        view.findings = [finding_dict(f) for f in result.findings]
        view.tool_calls = [dict(c) for c in result.tool_calls]
        view.blobs = [dict(b) for b in result.blobs]
        if content:
            hide_content(view)
            for fd in view.findings:
                for key in ("message", "suggested_fix"):
                    if fd.get(key):
                        fd[key] = scrub_text(str(fd[key]), hidden)
    return view


def loaded_frames(rows: Iterable[dict[str, Any]], dec: Any, content: bool,
                  hidden: set[str]) -> Iterator[tuple[LoadedFrame, bytes]]:
    """Stored frame rows as a view shows them, each with its payload as stored: secrets hidden (the
    write gate did it), content too when ``content``; the strings content redaction took out are
    added to ``hidden``."""
    for r in rows:
        payload = r["payload"] or b""
        f = Frame(kind=r["kind"], summary=r["summary"], payload=payload, flags=int(r["flags"]),
                  msg_type=r["msg_type"], error=r["error"], raw=r["raw"], ref_id=r["ref_id"],
                  call_id=r["call_id"], append_seqno=r["append_seqno"], request_id=r["request_id"])
        # secrets were hidden by the write gate; this hides content too when asked (and is idempotent)
        f = redact_frame(f, content=content, decoder=dec)
        if content and f.payload is not payload:
            hidden |= _strings(_tree(dec, r, payload)) - _strings(_tree(dec, r, f.payload))
        yield LoadedFrame(
            seq=int(r["seq"]), ts_us=int(r["ts_us"] or 0), direction=r["direction"] or "", transport=r["transport"] or "",
            kind=r["kind"] or "", summary=f.summary, msg_type=r["msg_type"], flags=int(r["flags"]),
            size=int(r["size"]), payload=f.payload, ref_id=r["ref_id"], call_id=r["call_id"], error=r["error"],
            meta=stored_meta(r["meta"]), _decoder=dec), payload


PAGE = 50_000   # frames read at a time when a view walks a whole session without payloads


def frame_pages(src: Reader, session_id: str, page: int = PAGE) -> Iterator[Any]:
    """Every frame of a session in seq order, without its payload, as Arrow tables of at most
    ``page`` rows (``seq``, ``ts_us``, ``direction``, ``kind``, ``ref_id``): a view that draws a
    session of any size holds one page, never the session."""
    after = -(2 ** 62)
    while True:
        t = queries.frame_lines_page(src, session_id, after, page)
        if t.num_rows == 0:
            return
        yield t
        if t.num_rows < page:
            return
        after = t.column("seq")[-1].as_py()


def frame_lines(src: Reader, session_id: str, page: int = PAGE) -> Iterator[LinkedFrame]:
    """``frame_pages`` one frame at a time."""
    for t in frame_pages(src, session_id, page):
        cols = (t.column(n).to_pylist() for n in ("seq", "ts_us", "direction", "kind", "ref_id"))
        for seq, ts_us, direction, kind, ref in zip(*cols, strict=True):
            yield LinkedFrame(seq, ts_us or 0, direction or "", kind or "", ref)


def load_links(src: Reader, session_id: str) -> list[LinkedSession]:
    """The sessions on the other side of a bridge linked to this one, in start order ([] when none)."""
    out: list[LinkedSession] = []
    for link in listing_links(src, [session_id]).get(session_id, []):
        other = str(link.get("session_id"))
        window = bridge_reads.session_window(src, other)
        if window is None:  # a stored link to a session no longer in the database
            continue
        frames = [LinkedFrame(int(r["seq"]), int(r["ts"] or 0), r["direction"] or "", r["kind"] or "")
                  for r in bridge_reads.frame_lines(src, other)]
        out.append(LinkedSession(other, window["transport"] or "", str(link.get("role") or ""),
                                 [str(b) for b in link.get("by") or []], frames))
    return sorted(out, key=lambda lk: (lk.frames[0].ts_us if lk.frames else 0, lk.session_id))


_MIN_HIDDEN = 4   # shorter strings (a flag, a digit) would blank words in every message


def _tree(dec: Any, r: dict[str, Any], payload: bytes) -> Any:

    try:
        return fields_of(dec, r["kind"], payload, r["msg_type"], int(r["flags"]))
    except Exception:  # undecodable: nothing to collect from it
        return None


def _strings(tree: Any) -> set[str]:
    """Every string of a decoded tree, and of JSON documents held in its strings (KV blobs, args)."""
    out: set[str] = set()
    stack = [tree]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and len(v) >= _MIN_HIDDEN:
            out.add(v)
            text = v.strip()
            if text[:1] in "{[" and text[-1:] in "}]":
                try:
                    stack.append(load_json(text))
                except ValueError:
                    pass
    return out


def scrub_text(text: str, hidden: set[str]) -> str:
    """``text`` with every string of ``hidden`` in it (longest first) replaced by its marker."""

    for value in sorted((h for h in hidden if h in text), key=len, reverse=True):
        text = text.replace(value, marker(value))
    return text


def safe_label(label: str | None, prompt: bytes) -> str | None:
    """The label, unless it is an excerpt of the prompt (``--redact content`` hides prompts): a
    scenario name the maker set, or one the prompt names with ``[scenario:NAME]``, stays."""
    if not label:
        return label
    raw = label.encode()
    if raw not in prompt:
        return label  # not taken from the prompt: a scenario name set by the demo or a fixture
    if _SCENARIO_LABEL.match(label) and f"[scenario:{label}]".encode() in prompt:
        return label
    return None


def hide_content(view: SessionView) -> None:
    """Tool arguments and results, blob previews and finding messages quote content: markers instead."""

    for c in view.tool_calls:
        for key in ("args_streamed", "args_completion", "args_merged", "args_naive", "result"):
            if c.get(key):
                c[key] = marker(str(c[key]))
    for b in view.blobs:
        b.pop("data", None)
        if b.get("preview"):
            b["preview"] = marker(str(b["preview"]))


@contextmanager
def open_source(spec: str, db: str | None) -> Iterator[tuple[Reader, str]]:
    """The reader and session id that ``spec`` names: a fixture file, else a session (prefix) in ``db``."""
    path = Path(spec)
    if path.is_file():

        fx = load(path)  # FixtureError (a WorkbenchError) names the file
        store = Store(":memory:")
        try:
            sid = fixture_to_store(fx, store)
            store.path = str(path)  # errors and reports name the fixture file
            yield store, sid
        finally:
            store.close()
        return
    if db is None:
        raise SessionError(f"{spec!r} is not a file, and no capture database was given (--db)")

    reader = open_reader(db)
    try:
        yield reader, queries.resolve_session(reader, spec)
    finally:
        reader.close()

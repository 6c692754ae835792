"""Import identity: every recorded unit is written once and whole; re-imports add only what is new.

A *unit* is what a file records as one piece: a mitmproxy flow (``flow:<flow id>``), a HAR entry
(``har:<hash of the entry>``), a stream-json line (``ndjson:<session>:<line>:<hash of the line>``),
a fixture (``fixture:<hash>``). Each frame an import writes carries ``source_key = <unit>#<n>``
(its place in the unit), and the schema keeps ``source_key`` and ``(session_id, seq)`` unique, so
no path can write a frame twice.

Flow and HAR imports build whole sessions (``SessionPlan``) and compare each with the database:

- none of its units stored → written;
- all of its units are stored (in it, or in a fuller session) → skipped (already imported);
- the stored session holds some of them (a grown file, an import that was killed) → the session is
  rebuilt from the file: its frames are replaced, in one transaction, keeping its label;
- its appends were stored earlier as a group without their stream (``appends_without_stream``) →
  that group is absorbed into the rebuilt session;
- anything else (the database holds units this file lacks, in another session) → left alone and
  reported.

Sessions are committed in batches, each batch in one transaction (frames, session rows and the
deletions of rebuilt sessions together), so an interrupted import leaves whole sessions only and a
re-run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.decode.classify import Frame
from workbench.store.db import SessionInfo, Store
from workbench.store.queries import (
    sessions_of_source_keys,
    source_keys_of,
    stored_units_of_sessions,
)
from workbench.store.recorder import Recorder

BATCH_FRAMES = 20_000
BATCH_SESSIONS = 500


def frame_key(unit: str, n: int) -> str:
    return f"{unit}#{n}"


@dataclass(slots=True)
class PlannedFrame:
    ts_us: int
    direction: str
    transport: str
    stream: str | None
    frame: Frame
    source_key: str | None
    decoded: str | None = None


@dataclass
class SessionPlan:
    """A session as the file records it, ready to be written whole."""

    info: SessionInfo
    units: list[str]
    frames: list[PlannedFrame]
    # Appends whose stream is not in the file: a later import holding the stream takes them over.
    absorbable: bool = False


@dataclass
class WriteOutcome:
    written: list[str] = field(default_factory=list)    # new sessions
    updated: list[str] = field(default_factory=list)    # stored sessions rebuilt with new units
    skipped: list[str] = field(default_factory=list)    # already imported
    absorbed: list[str] = field(default_factory=list)   # append groups taken over by their stream
    conflicts: list[str] = field(default_factory=list)  # messages: left alone
    frames: int = 0
    skipped_frames: int = 0

    @property
    def session_ids(self) -> list[str]:
        return self.written + self.updated

    def notes(self) -> list[str]:
        def n(k: int, one: str, many: str) -> str:
            return f"{k} {one if k == 1 else many}"

        out = []
        if self.skipped:
            word = "resumed: " if self.written or self.updated else ""
            out.append(f"{word}{n(len(self.skipped), 'session', 'sessions')} already imported, skipped")
        if self.updated:
            out.append(f"{n(len(self.updated), 'session', 'sessions')} completed with new frames")
        if self.absorbed:
            out.append(f"{n(len(self.absorbed), 'earlier append group', 'earlier append groups')} joined to "
                       f"{'its stream' if len(self.absorbed) == 1 else 'their streams'}")
        if self.conflicts:
            out.append(f"{n(len(self.conflicts), 'session', 'sessions')} left as stored (see warnings)")
        return out


@dataclass
class _Stored:
    units: set[str]
    unkeyed: int
    label: str | None
    absorbable: bool


def _stored_sessions(store: Store, session_ids: Sequence[str]) -> dict[str, _Stored]:
    if not session_ids:
        return {}
    rows = stored_units_of_sessions(store, session_ids)
    return {r["session_id"]: _Stored(set(r["units"] or []), int(r["unkeyed"] or 0), r["label"], bool(r["absorbable"]))
            for r in rows}


def stored_units(store: Store, units: Sequence[str]) -> dict[str, str]:
    """Which of ``units`` are stored already, and in which session (looked up by their first frame)."""
    if not units:
        return {}
    keys = [frame_key(u, 0) for u in units]
    return {key[:-2]: sid for key, sid in sessions_of_source_keys(store, keys).items()}


def stored_keys(store: Store, session_id: str) -> set[str]:
    """Every source_key of one stored session (what an incremental import skips)."""
    return source_keys_of(store, session_id)


def _decide(plan: SessionPlan, present: dict[str, str], stored: dict[str, _Stored]) -> tuple[str, list[str], str]:
    """(action, sessions to delete first, message): action is new | skip | rebuild | conflict."""
    sid = plan.info.session_id
    units = set(plan.units)
    if units and units <= set(present):
        return "skip", [], ""  # all stored already (perhaps inside a fuller session: appends joined to their stream)
    mine = stored.get(sid)
    others = sorted({s for u, s in present.items() if s != sid})
    blocked = [s for s in others if not (s in stored and stored[s].absorbable and stored[s].units <= units)]
    if blocked:
        return "conflict", [], (f"session {sid}: {len([u for u, s in present.items() if s in blocked])} of its "
                                f"units are already stored in session(s) {', '.join(blocked[:3])}; left as stored")
    if mine is None:
        return ("rebuild" if others else "new"), others, ""
    if mine.unkeyed and not mine.units:
        return "skip", [], "recorded before import identities were kept (or live); not re-imported"
    if mine.units == units and not others:
        return "skip", [], ""
    if mine.units < units or (mine.units <= units and others):
        return "rebuild", [sid, *others], ""
    if units <= mine.units:
        return "skip", [], ""
    extra = sorted(mine.units - units)
    return "conflict", [], (f"session {sid}: the database holds {len(extra)} unit(s) this file lacks "
                            f"(e.g. {extra[0]}) and the file holds new ones; left as stored")


def _add_plan(rec: Recorder, plan: SessionPlan) -> None:
    info = plan.info
    sid = info.session_id
    if plan.frames:  # the session's time span is its frames'
        info.started_at = info.ended_at = None
    rec.put_session(info)
    for seq, pf in enumerate(plan.frames):
        rec.add(sid, pf.ts_us, pf.direction, pf.transport, pf.stream, pf.frame, pf.decoded, pf.source_key, seq=seq)
    info.frame_count = len(plan.frames)


def write_plans(store: Store, plans: Sequence[SessionPlan], *, warn: Callable[[str], None],
                progress: Callable[[int, int], None] = lambda _done, _skipped: None,
                batch_frames: int | None = None, batch_sessions: int | None = None) -> WriteOutcome:
    """Write what is new of ``plans`` through the store's write gate (``Recorder``); whole
    sessions per transaction."""
    batch_frames = batch_frames or BATCH_FRAMES
    batch_sessions = batch_sessions or BATCH_SESSIONS
    out = WriteOutcome()
    all_units = [u for p in plans for u in p.units]
    present = stored_units(store, all_units)
    involved = {p.info.session_id for p in plans} | set(present.values())
    stored = _stored_sessions(store, sorted(involved))

    rec = Recorder(store)
    sessions_in_batch = 0
    deletes: list[str] = []

    def commit() -> None:
        nonlocal sessions_in_batch
        if not sessions_in_batch and not deletes:
            return
        with store.transaction():  # deletions, frames and session rows together
            store.delete_sessions(deletes)
            rec.flush()
        rec.sessions.clear()
        sessions_in_batch = 0
        deletes.clear()

    for done, plan in enumerate(plans, 1):
        sid = plan.info.session_id
        mine = {u: present[u] for u in plan.units if u in present}
        action, delete_first, message = _decide(plan, mine, stored)
        if action == "skip":
            out.skipped.append(sid)
            out.skipped_frames += len(plan.frames)
            if message:
                warn(f"{message}: {sid}")
        elif action == "conflict":
            out.conflicts.append(message)
            warn(message)
        else:
            if sid in stored:
                plan.info.label = plan.info.label or stored[sid].label
                out.updated.append(sid)
            else:
                out.written.append(sid)
            out.absorbed.extend(s for s in delete_first if s != sid)
            if any(s != sid for s in delete_first):
                plan.info.meta["absorbed_sessions"] = [s for s in delete_first if s != sid]
            deletes.extend(delete_first)
            _add_plan(rec, plan)
            sessions_in_batch += 1
            out.frames += len(plan.frames)
            # what this import wrote now counts as stored for the plans after it
            stored[sid] = _Stored(set(plan.units), 0, plan.info.label, plan.absorbable)
            for u in plan.units:
                present[u] = sid
            for s in delete_first:
                if s != sid:
                    stored.pop(s, None)
        if len(rec.batch) >= batch_frames or sessions_in_batch >= batch_sessions:
            commit()
        progress(done, len(out.skipped))
    commit()
    return out

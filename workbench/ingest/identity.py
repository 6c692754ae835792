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

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from workbench.decode.classify import Frame
from workbench.store.db import SessionInfo, Store
from workbench.store.queries import (
    holds_prefixed,
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


class PlanWriter:
    """Writes SessionPlans through the store's write gate (``Recorder``), whole sessions per
    transaction, deciding for each what is new (``_decide``). Plans may come in several calls to
    ``write`` (a packet capture writes a session while tshark still reads the file): each call looks
    up only what the calls before it did not, and what this import wrote counts as stored for every
    plan after it, so the decisions are those one call with all the plans would make. ``close``
    commits the last batch."""

    def __init__(self, store: Store, *, warn: Callable[[str], None],
                 progress: Callable[[int, int], None] = lambda _done, _skipped: None,
                 batch_frames: int | None = None, batch_sessions: int | None = None,
                 prefixes: tuple[str, str] | None = None) -> None:
        self.store = store
        # (unit prefix, session id prefix) every plan of this import has: when the database holds
        # nothing with either before the import begins, nothing needs looking up (a capture written
        # while tshark reads looks up each session on its own, and a lookup reads the frames table)
        self.fresh = prefixes if prefixes is not None and not holds_prefixed(store, *prefixes) else None
        self.warn = warn
        self.progress = progress
        self.batch_frames = batch_frames or BATCH_FRAMES
        self.batch_sessions = batch_sessions or BATCH_SESSIONS
        self.out = WriteOutcome()
        self.rec = Recorder(store)
        self.done = 0
        # unit → session, as the database held it before this import, overlaid with what it wrote
        self.present: dict[str, str] = {}
        self.stored: dict[str, _Stored] = {}
        # sessions looked up and not found, or deleted by this import: never looked up again (a
        # deletion waits in the open batch, so the database would still show them)
        self.absent: set[str] = set()
        self._in_batch = 0
        self._deletes: list[str] = []
        # sessions this import wrote (→ their frames counted in ``out``), and those in the open batch
        self._wrote: dict[str, int] = {}
        self._batched: set[str] = set()
        self._skips: dict[str, list[int]] = {}  # session → frames of each of its plans skipped

    def _look_up(self, plans: Sequence[SessionPlan]) -> None:
        """What the database holds of ``plans``' units and sessions that no earlier call looked up.

        A unit not in ``present`` is either not stored or stored by an earlier import in a session
        this import has not deleted (a session it deletes has all its units rewritten, which puts
        them in ``present``), so the database answers as it would have before this import began."""
        fresh = self.fresh
        units = [u for p in plans for u in p.units
                 if u not in self.present and not (fresh and u.startswith(fresh[0]))]
        self.present.update(stored_units(self.store, units))
        involved = {p.info.session_id for p in plans} | {self.present[u] for p in plans for u in p.units
                                                          if u in self.present}
        new = sorted(s for s in involved
                     if s not in self.stored and s not in self.absent and not (fresh and s.startswith(fresh[1])))
        found = _stored_sessions(self.store, new)
        self.stored.update(found)
        self.absent.update(s for s in new if s not in found)

    def commit(self) -> None:
        if not self._in_batch and not self._deletes:
            return
        with self.store.transaction():  # deletions, frames and session rows together
            self.store.delete_sessions(self._deletes)
            self.rec.flush()
        self.rec.sessions.clear()
        self._in_batch = 0
        self._deletes.clear()
        self._batched.clear()

    def write(self, plans: Sequence[SessionPlan], *, only: Container[str] | None = None) -> list[str | None]:
        """Write what is new of ``plans``; the action taken for each. With ``only``, a plan whose
        action is not among them (or comes with a warning) is left alone: None, nothing counted.
        ``repeat``: a skipped plan all of whose units this import wrote (the file holds them twice)."""
        self._look_up(plans)
        out, present, stored = self.out, self.present, self.stored
        actions: list[str | None] = []
        for plan in plans:
            sid = plan.info.session_id
            mine = {u: present[u] for u in plan.units if u in present}
            action, delete_first, message = _decide(plan, mine, stored)
            if action == "skip" and plan.units and set(plan.units) <= mine.keys() and \
                    all(s in self._wrote for s in mine.values()):
                action = "repeat"  # a copy of what this import wrote from this file: nothing to count
            if only is not None and (action not in only or message):
                actions.append(None)
                continue
            actions.append(action)
            self.done += 1
            if action == "skip":
                self._count_skip(sid, len(plan.frames))
                if message:
                    self.warn(f"{message}: {sid}")
            elif action == "conflict":
                out.conflicts.append(message)
                self.warn(message)
            elif action != "repeat":
                fresh = self._replace(delete_first)
                if sid in stored and sid not in fresh:
                    plan.info.label = plan.info.label or stored[sid].label
                    out.updated.append(sid)
                else:
                    out.written.append(sid)
                absorbed = [s for s in delete_first if s != sid and s not in fresh]
                out.absorbed.extend(absorbed)
                if absorbed:
                    plan.info.meta["absorbed_sessions"] = absorbed
                self._deletes.extend(delete_first)
                _add_plan(self.rec, plan)
                self._in_batch += 1
                self._batched.add(sid)
                self._wrote[sid] = len(plan.frames)
                out.frames += len(plan.frames)
                # what this import wrote now counts as stored for the plans after it
                stored[sid] = _Stored(set(plan.units), 0, plan.info.label, plan.absorbable)
                self.absent.discard(sid)
                for u in plan.units:
                    present[u] = sid
                for s in delete_first:
                    if s != sid:
                        stored.pop(s, None)
                        self.absent.add(s)
            if len(self.rec.batch) >= self.batch_frames or self._in_batch >= self.batch_sessions:
                self.commit()
            self.progress(self.done, len(out.skipped))
        return actions

    def _count_skip(self, sid: str, frames: int, *, undo: bool = False) -> None:
        """A session skipped counts once, with the most frames any of its plans has (a capture
        holding a connection twice, imported again, skips the session once)."""
        counts = self._skips.setdefault(sid, [])
        before = max(counts, default=0)
        if undo:
            counts.remove(frames)
        else:
            counts.append(frames)
        self.out.skipped_frames += max(counts, default=0) - before
        if not counts:
            del self._skips[sid]
            self.out.skipped.remove(sid)
        elif len(counts) == 1 and not undo:
            self.out.skipped.append(sid)

    def _replace(self, delete_first: Sequence[str]) -> set[str]:
        """Before a plan rebuilds sessions this import wrote itself (a capture holding a connection
        twice, the later copy fuller): their frames leave the open batch first (committed, so the
        deletion in the plan's batch removes them: a batch inserts after it deletes, and the schema
        keeps (session_id, seq) and source_key unique), and the outcome forgets them, as if only the
        rebuilding plan had come. Returns those of them that were not stored before this import."""
        mine = [s for s in delete_first if s in self._wrote]
        if not mine:
            return set()
        if self._batched.intersection(mine):
            self.commit()
        out = self.out
        fresh = {s for s in mine if s in out.written}
        for s in mine:
            out.frames -= self._wrote.pop(s)
            (out.written if s in fresh else out.updated).remove(s)
        return fresh

    def unwrite(self, plan: SessionPlan, action: str) -> None:
        """Take back a plan written (``new``) or skipped by an earlier ``write``, as if it had never
        come: a session a capture wrote early whose exchange changed after all (see
        ``workbench.ingest.pcap``). Only ``new`` and ``skip`` can be taken back: they deleted nothing."""
        sid = plan.info.session_id
        self.done -= 1
        if action == "skip":
            self._count_skip(sid, len(plan.frames), undo=True)
            return
        assert action == "new", action
        self.commit()
        with self.store.transaction():
            self.store.delete_sessions([sid])
        self.out.written.remove(sid)
        self.out.frames -= len(plan.frames)
        self._wrote.pop(sid, None)
        self.stored.pop(sid, None)
        self.absent.add(sid)
        for u in plan.units:
            if self.present.get(u) == sid:
                del self.present[u]

    def close(self) -> WriteOutcome:
        self.commit()
        return self.out


def write_plans(store: Store, plans: Sequence[SessionPlan], *, warn: Callable[[str], None],
                progress: Callable[[int, int], None] = lambda _done, _skipped: None,
                batch_frames: int | None = None, batch_sessions: int | None = None) -> WriteOutcome:
    """Write what is new of ``plans`` through the store's write gate (``Recorder``); whole
    sessions per transaction."""
    writer = PlanWriter(store, warn=warn, progress=progress, batch_frames=batch_frames, batch_sessions=batch_sessions)
    writer.write(plans)
    return writer.close()

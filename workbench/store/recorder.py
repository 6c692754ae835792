"""Turn classified frames from many sessions into batched store writes.

The recorder owns sequence numbers (``seq`` counts a session's frames in wire order, both
directions together) and session bookkeeping (frame_count, time bounds). It is not thread-safe:
one writer thread, or one importing process, drives it.
"""

from __future__ import annotations

from workbench.decode.classify import Frame
from workbench.store.db import FrameBatch, SessionInfo, Store, us_to_datetime


class Recorder:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.batch = FrameBatch()
        self.sessions: dict[str, SessionInfo] = {}
        self._next: dict[str, int] = {}
        self._dirty: set[str] = set()
        self.frames_written = 0

    def open_session(self, info: SessionInfo) -> SessionInfo:
        """Register a session (or pick up an existing one so its frames continue its seq)."""
        known = self.sessions.get(info.session_id)
        if known is not None:
            return known
        stored = self.store.session(info.session_id)
        if stored is not None:
            info = stored
            self._next[info.session_id] = self.store.next_seq(info.session_id)
        else:
            self._next[info.session_id] = 0
        self.sessions[info.session_id] = info
        self._dirty.add(info.session_id)
        return info

    def touch(self, session_id: str) -> None:
        """Mark a session's metadata as changed so the next flush writes it."""
        self._dirty.add(session_id)

    def add(self, session_id: str, ts_us: int, direction: str, transport: str, stream: str | None,
            frame: Frame) -> int:
        info = self.sessions.get(session_id) or self.open_session(SessionInfo(session_id))
        seq = self._next[session_id]
        self._next[session_id] = seq + 1
        self.batch.add(session_id, seq, ts_us, direction, transport, stream, frame)
        info.frame_count = seq + 1
        when = us_to_datetime(ts_us)
        if info.started_at is None or when < info.started_at:
            info.started_at = when
        if info.ended_at is None or when > info.ended_at:
            info.ended_at = when
        self._dirty.add(session_id)
        return seq

    def flush(self) -> int:
        """Write pending frames and changed sessions; returns the number of frames written."""
        n = 0
        if len(self.batch):
            n = self.store.insert_frames(self.batch)
            self.batch.clear()
            self.frames_written += n
        if self._dirty:
            self.store.upsert_sessions(self.sessions[s] for s in sorted(self._dirty))
            self._dirty.clear()
        return n

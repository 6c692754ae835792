"""What the client keeps of its own traffic: the frame log (agent messages, in time order) and,
with ``record_to``, a recording in the store (every wire frame, one session per run)."""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple

from workbench.decode.classify import Frame, default_decoder
from workbench.protocol.status import ExchangeEnd, session_status, with_append
from workbench.schema.active import schema_stamp


class FrameLogEntry(NamedTuple):
    """One agent message the client sent or received: exact AgentClientMessage/AgentServerMessage
    bytes (unwrapped from BidiAppend hex / BidiPoll base64), as a capture would store them."""

    ts_us: int
    direction: str  # "client" (client→server) | "server"
    transport: str  # "run" | "bidi_append" | "runsse" | "runpoll"
    data: bytes


class Journal:
    """The recording: frames wait here until their turn is over, then go to the ``Recorder``
    sorted by timestamp (appends are only known to be sent once answered, after later frames)."""

    def __init__(self, record_to: Any) -> None:
        from workbench.store.db import Store  # DuckDB loads only for a client that records
        from workbench.store.recorder import Recorder  # (the store, as above)

        self._own_store = not isinstance(record_to, Store)
        self.store = Store(record_to) if self._own_store else record_to
        self.recorder = Recorder(self.store)
        self.pending: list[tuple[int, str, str, str, Frame]] = []
        self.session_id: str | None = None

    def drain(self) -> None:
        if not self.pending:
            return
        self.pending.sort(key=lambda j: j[0])
        for ts, sid, direction, transport, frame in self.pending:
            self.recorder.add(sid, ts, direction, transport, None, frame)
        self.pending.clear()

    def open_session(self, session_id: str, **info: Any) -> None:
        from workbench.store.db import SessionInfo  # DuckDB loads only for a client that records

        self.session_id = session_id
        info["meta"] = {**info.get("meta", {}), **schema_stamp(default_decoder().schema)}
        self.recorder.open_session(SessionInfo(session_id=session_id, source="client", **info))

    def finish_session(self, session_id: str, end: ExchangeEnd,
                       refused: tuple[str, str | None, str] | None = None) -> None:
        """Settle a run's session: status and error by ``workbench.protocol.status`` from how its
        exchange ended (``refused``: the first BidiAppend refused while the run was going on)."""
        self.drain()
        info = self.recorder.sessions.get(session_id)
        if info is not None:
            info.status, info.error = session_status(end)
            if refused is not None:
                info.status, info.error = with_append(info.status, info.error, *refused)
            info.http_status = end.http_status
            if end.reset is not None:
                info.meta["reset"] = dict(end.reset)
            self.recorder.touch(session_id)
        self.recorder.flush()

    def close(self) -> None:
        from workbench.analysis.stored import refresh_findings  # loads the analysis only when recording

        self.drain()
        self.recorder.flush()
        refresh_findings(self.store, list(self.recorder.sessions))  # findings stored when the recording ends
        if self._own_store:
            self.store.close()


class RunWire:
    """One run's traffic: agent messages go to the frame log (kept in timestamp order: a
    BidiAppend is logged only once answered, possibly after later frames), wire frames to the
    journal under this run's session."""

    def __init__(self, frame_log: list[FrameLogEntry], journal: Journal | None, session_id: str) -> None:
        self.frame_log = frame_log
        self.journal = journal
        self.session_id = session_id
        self.recording = journal is not None

    def message(self, ts_us: int, direction: str, transport: str, data: bytes) -> None:
        bisect.insort(self.frame_log, FrameLogEntry(ts_us, direction, transport, data), key=lambda e: e.ts_us)

    def frame(self, ts_us: int, direction: str, transport: str, frame: Frame) -> None:
        if self.journal is not None:
            self.journal.pending.append((ts_us, self.session_id, direction, transport, frame))

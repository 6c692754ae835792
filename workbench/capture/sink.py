"""Where the capture writer's frames go: the database, else the spool, else memory; never nowhere.

The writer thread (``writer.py``) hands every classified, redacted frame to ``Sink.emit`` and calls
``Sink.flush`` once per tick. The chain, in order:

1. the database, through a ``Recorder`` (one committed transaction per flush);
2. when the database cannot be opened or a commit fails: the spool (``spool.py``), first next to
   the database, then in the user's state directory;
3. when no spool location takes a write (both disks full): frames are held in memory, up to
   ``hold_frames`` frames and ``hold_bytes`` bytes, and every flush tries the spool again;
4. beyond that bound frames are counted as lost, and so is whatever is still held at stop.

``lost`` is exact: it counts frames that reached the writer but are in neither the database nor
a spool file. The addon reports it at stop and makes the process exit non-zero.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.capture.spool import FrameRecord, Spool, SpoolError, merge_spools
from workbench.decode.classify import Frame
from workbench.store.db import SessionInfo, Store, StoreError, us_to_datetime
from workbench.store.reader import LiveService
from workbench.store.recorder import Recorder

log = logging.getLogger("workbench.capture")

HOLD_FRAMES = 100_000
HOLD_BYTES = 256 * 1024 * 1024


@dataclass
class SinkConfig:
    db_path: str
    live: bool = True
    stats_path: str | None = None
    hold_frames: int = HOLD_FRAMES
    hold_bytes: int = HOLD_BYTES


def _remove_empty(path: str) -> None:
    for p in (path, path + ".wal"):
        try:
            if os.path.getsize(p) == 0:
                os.unlink(p)
        except OSError:
            pass


def _record_size(rec: FrameRecord) -> int:
    f = rec.frame
    return len(f.payload) + len(f.raw or b"") + len(f.summary) + 200


class Sink:
    """Owns the store (or the spool) for one capture process; driven by the writer thread only."""

    def __init__(self, config: SinkConfig, loud: Callable[[str], None],
                 note: Callable[[str], None] | None = None) -> None:
        self.config = config
        self._loud = loud
        self._note = note or loud
        self.store: Store | None = None
        self.recorder: Recorder | None = None
        self.live: LiveService | None = None
        self.spool: Spool | None = None
        self.sessions: dict[str, SessionInfo] = {}   # spool mode: the writer's own session rows
        self._spool_seq: dict[str, int] = {}
        self._pending: list[FrameRecord] = []
        self._held_bytes = 0
        self._dirty: set[str] = set()
        self.frames_total = 0
        self.frames_committed = 0
        self.lost = 0
        self._holding_said = False
        self._dropping_said = False

    # lifecycle ---------------------------------------------------------------------------------

    def open(self, settle_open: bool = True) -> None:
        """Open the database (else the spool); ``settle_open``: mark the sessions an earlier capture
        left open as ended (off for a writer process restarted to go on with them)."""
        path = self.config.db_path
        existed = os.path.exists(path)
        try:
            self.store = Store(path)
        except (StoreError, OSError) as exc:
            if not existed:
                _remove_empty(path)  # a failed create (full disk) must not leave a file DuckDB refuses later
            self.fail(f"cannot open capture database {path}: {exc}")
            return
        try:
            merge_spools(self.store, path)
        except Exception as exc:  # a broken spool must not stop the capture; it stays for the next start
            self._loud(f"could not merge the spool into {path} (left in place for the next start): {exc}")
        try:
            # A previous capture killed mid-stream left sessions marked open; nobody else can be
            # writing them now that we hold the file.
            if settle_open:
                self.store.close_open_sessions("capture", "capture ended before the stream finished")
        except Exception as exc:
            self._loud(f"could not settle the sessions a previous capture left open in {path}: {exc}")
        self.recorder = Recorder(self.store)
        try:
            # Pay the first insert's one-time cost (~0.3 s) before traffic: otherwise the first
            # commit lags by that much, and a crash right then loses older frames.
            self.store.warm_up()
        except Exception as exc:  # only an optimisation
            log.debug("warm-up failed: %s", exc)
        if self.config.live:
            try:
                self.live = LiveService(self.store.con, path)
                self.live.start()
            except OSError as exc:
                self._loud(f"live read service not started ({exc}); readers must wait for the capture to end")
                self.live = None

    def close(self) -> None:
        """Final flush done by the caller; whatever is still held now is lost."""
        if self._pending:
            self.lost += len(self._pending)
            self._pending.clear()
        self._drop_database(checkpoint=True)
        if self.spool is not None:
            self.spool.close()
        self.write_stats()

    def fail(self, msg: str) -> None:
        """Switch to the spool: the database is unusable for the rest of this run."""
        if self.spool is None:
            self.spool = Spool(self.config.db_path)
        where = (f"frames go to the spool {self.spool.path} and are merged on the next start"
                 if self.spool.path is not None else
                 f"and no spool location opens ({'; '.join(self.spool.errors)}): frames are held in memory")
        self._loud(f"{msg}; {where}")
        if self.recorder is not None:
            self.sessions.update(self.recorder.sessions)
            self._spool_seq.update({s: i.frame_count for s, i in self.recorder.sessions.items()})
            self._dirty.update(self.recorder.sessions)
            self.recorder = None
        self._drop_database(checkpoint=False)

    def _drop_database(self, checkpoint: bool) -> None:
        """Stop the live read service and close the database (after a checkpoint when asked); a
        database that fails to close is let go all the same: nothing more is written to it."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.store is not None:
            if checkpoint:
                with contextlib.suppress(Exception):
                    self.store.checkpoint()
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = None

    # sessions and frames -----------------------------------------------------------------------

    def get_session(self, sid: str) -> SessionInfo | None:
        if self.recorder is not None:
            return self.recorder.sessions.get(sid)
        return self.sessions.get(sid)

    def open_session(self, info: SessionInfo) -> SessionInfo:
        if self.recorder is not None:
            try:
                return self.recorder.open_session(info)
            except Exception as exc:
                self.fail(f"cannot read session {info.session_id} from {self.config.db_path}: {exc}")
        self.sessions.setdefault(info.session_id, info)
        self._spool_seq.setdefault(info.session_id, 0)
        self._dirty.add(info.session_id)
        return self.sessions[info.session_id]

    def touch(self, sid: str) -> None:
        if self.recorder is not None:
            self.recorder.touch(sid)
        else:
            self._dirty.add(sid)

    def emit(self, sid: str, ts_us: int, direction: str, transport: str, stream: str | None,
             f: Frame) -> int | None:
        """Record one frame; its ``seq`` when it went to the database (None in spool mode)."""
        if self.recorder is not None:
            seq = self.recorder.add(sid, ts_us, direction, transport, stream, f)
        else:
            info = self.sessions.get(sid) or self.open_session(SessionInfo(sid))
            seq = self._spool_seq.get(sid, 0)
            self._spool_seq[sid] = seq + 1
            info.frame_count = seq + 1
            when = us_to_datetime(ts_us)
            info.started_at = min(info.started_at or when, when)
            info.ended_at = max(info.ended_at or when, when)
            self._dirty.add(sid)
        self._pending.append(FrameRecord(sid, seq, ts_us, direction, transport, stream, f))
        self.frames_total += 1
        return seq

    def patch_meta(self, sid: str, seq: int | None, f: Frame, meta: dict[str, Any]) -> None:
        """Complete the ``meta`` of a frame already handed over (a BidiAppend whose answer came).

        Database mode: the recorder replaces it (in its batch, or with its next commit). In spool
        mode the pending record holds ``f`` itself, whose meta the caller has set; a frame already
        written to the spool keeps the meta it was written with.
        """
        if self.recorder is not None and seq is not None:
            self.recorder.patch_meta(sid, seq, meta)

    def last_pending(self) -> tuple[str, int] | None:
        """(session, seq) of the last frame the next flush commits (None: no frame, or unnumbered)."""
        if not self._pending:
            return None
        rec = self._pending[-1]
        return (rec.session_id, rec.seq) if rec.seq is not None else None

    def count_lost(self, n: int = 1) -> None:
        """``n`` frames that will not be recorded (a body a restarted writer could not go on with)."""
        self.lost += n

    def committed_after_flush(self) -> int:
        """``frames_committed`` once the next flush has committed (when the database takes it)."""
        return self.frames_committed + (len(self._pending) if self.recorder is not None else 0)

    def has_frame(self, sid: str, seq: int) -> bool | None:
        """Whether the database holds frame ``seq`` of ``sid`` (None: no database to ask)."""
        if self.store is None:
            return None
        try:
            return self.store.next_seq(sid) > seq  # a session's frames are numbered without gaps
        except Exception:
            return None

    # flushing ----------------------------------------------------------------------------------

    def flush(self) -> None:
        records = self._pending
        if self.recorder is not None:
            try:
                self.recorder.flush()  # frames and their sessions: one transaction
                self.frames_committed += len(records)
                records.clear()
            except Exception as exc:
                self.fail(f"writing {len(records)} frames to {self.config.db_path} failed: {exc}")
        if self.recorder is None:
            self._flush_spool(records)
        self.write_stats()

    def _flush_spool(self, records: list[FrameRecord]) -> None:
        if self.spool is None:
            self.spool = Spool(self.config.db_path)
        before = self.spool.path
        try:
            self.spool.write([self.sessions[s] for s in sorted(self._dirty) if s in self.sessions], records,
                             all_sessions=lambda: list(self.sessions.values()))
        except SpoolError as exc:
            self._hold(records, str(exc))
            return
        if self.spool.path != before and before is not None:
            self._loud(f"spool write to {before} failed; frames now go to {self.spool.path} "
                       "(merged on the next start)")
        if self._holding_said:
            self._note(f"the spool {self.spool.path} takes writes again; {len(records)} held frames written")
            self._holding_said = self._dropping_said = False
        self._dirty.clear()
        records.clear()
        self._held_bytes = 0

    def _hold(self, records: list[FrameRecord], why: str) -> None:
        """No location takes writes: keep frames in memory up to the bound, count the rest lost."""
        if not self._holding_said:
            self._loud(f"{why}; holding frames in memory (at most {self.config.hold_frames:,} frames / "
                       f"{self.config.hold_bytes // (1024 * 1024)} MiB) and retrying every flush")
            self._holding_said = True
        size = 0
        keep = 0
        for rec in records:
            size += _record_size(rec)
            if keep >= self.config.hold_frames or size > self.config.hold_bytes:
                break
            keep += 1
        dropped = len(records) - keep
        if dropped:
            self.lost += dropped
            del records[keep:]
            if not self._dropping_said:
                self._loud(f"memory bound reached: frames are being LOST ({self.lost:,} so far)")
                self._dropping_said = True
        self._held_bytes = size

    # stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        sessions = self.recorder.sessions if self.recorder is not None else self.sessions
        spool = self.spool
        return {
            "sessions": len(sessions),
            "open": sum(1 for s in sessions.values() if s.status == "open"),
            "frames": self.frames_total,
            "committed": self.frames_committed,
            "spooled": spool.frames if spool is not None else 0,
            "spool": str(spool.path) if spool is not None and spool.path and not spool.exhausted else None,
            "held": len(self._pending) if self.recorder is None else 0,
            "lost": self.lost,
            "db_ok": self.recorder is not None,
        }

    def write_stats(self) -> None:
        if self.config.stats_path:
            write_stats_file(self.config.stats_path, self.stats())


def write_stats_file(path: str, stats: dict[str, Any]) -> None:
    """Replace the counters file ``cursor_stats_file`` (atomically: readers see whole files)."""
    try:
        tmp = path + ".tmp"
        Path(tmp).write_text(json.dumps(stats))
        os.replace(tmp, path)
    except OSError:
        pass


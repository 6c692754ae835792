"""The spool: where capture puts frames when the database cannot be written.

An append-only NDJSON file (one record per line, bytes as hex). Its locations, in order: next to
the database (``<db>.spool``), then under the user's state directory
(``$XDG_STATE_HOME/workbench/spool`` or ``~/.local/state/workbench/spool``, keyed by a hash of the
database path). The spool starts at the first location it can open and moves on to the next when a
write fails there (a full disk, a directory that went away); it never moves back, so the files
hold records in capture order, location by location. A failed write is cut back to the last whole
batch (``ftruncate``), so a full disk never leaves half a batch behind.

Records are what the writer would have given the recorder: ``session`` (a SessionInfo row, latest
wins) and ``frame`` (session, time, direction, transport, stream and the classified, already
redacted frame). The next capture that can open the database replays every location's file, in
that order, through a Recorder (so seq numbers continue the sessions already stored) and deletes
them. A torn last line (a crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from workbench.decode.classify import Frame
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder

_FRAME_FIELDS = [f.name for f in fields(Frame)]
_BYTES_FIELDS = {"payload", "raw"}
FrameRecord = tuple[str, int, str, str, "str | None", Frame]


def spool_candidates(db_path: str | Path) -> list[Path]:
    db = Path(db_path).expanduser().absolute()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "workbench" / "spool"
    key = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    return [Path(str(db) + ".spool"), state / f"{db.name}-{key}.spool"]


def _session_json(info: SessionInfo) -> dict[str, Any]:
    d = asdict(info)
    for k in ("started_at", "ended_at"):
        v = d[k]
        d[k] = v.isoformat() if isinstance(v, datetime) else None
    return d


def _session_from(d: dict[str, Any]) -> SessionInfo:
    for k in ("started_at", "ended_at"):
        if d.get(k):
            d[k] = datetime.fromisoformat(d[k])
    return SessionInfo(**d)


def _frame_json(rec: FrameRecord) -> dict[str, Any]:
    session_id, ts_us, direction, transport, stream, f = rec
    fd: dict[str, Any] = {}
    for name in _FRAME_FIELDS:
        v = getattr(f, name)
        fd[name] = v.hex() if name in _BYTES_FIELDS and v is not None else v
    return {"t": "frame", "session_id": session_id, "ts_us": ts_us, "direction": direction,
            "transport": transport, "stream": stream, "frame": fd}


def _frame_from(d: dict[str, Any]) -> FrameRecord:
    fd = d["frame"]
    for name in _BYTES_FIELDS:
        if fd.get(name) is not None:
            fd[name] = bytes.fromhex(fd[name])
    return d["session_id"], int(d["ts_us"]), d["direction"], d["transport"], d.get("stream"), Frame(**fd)


class SpoolError(OSError):
    """No spool location accepts writes."""


class Spool:
    """Append-only writer over the candidate locations; ``path`` is the location in use (or None)."""

    def __init__(self, db_path: str | Path) -> None:
        self.candidates = spool_candidates(db_path)
        self.path: Path | None = None
        self.frames = 0
        self.errors: list[str] = []  # one line per location given up, for the user
        self._index = -1  # index of ``path`` in ``candidates``
        self._fd: int | None = None
        self._open_next()

    def _open_next(self, start: int | None = None) -> bool:
        """Open the first location from ``start`` (default: after the current one) that opens."""
        first = self._index + 1 if start is None else start
        for i in range(first, len(self.candidates)):
            cand = self.candidates[i]
            try:
                cand.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:
                self.errors.append(f"{cand}: {exc.strerror or exc}")
                continue
            self.close()
            self._fd, self.path, self._index = fd, cand, i
            return True
        return False

    @property
    def exhausted(self) -> bool:
        """True when no location is open (every one failed)."""
        return self._fd is None

    def write(self, sessions: Iterable[SessionInfo], frames: Iterable[FrameRecord],
              all_sessions: Callable[[], Iterable[SessionInfo]] | None = None) -> None:
        """Append one batch, moving to the next location when this one fails.

        A new location gets ``all_sessions()`` instead of ``sessions``, so every file is complete
        on its own. Raises SpoolError (nothing of the batch written) when no location takes it;
        the last location is tried again on the next call, since space may come back.
        """
        frame_lines = [json.dumps(_frame_json(r)) for r in frames]
        session_lines = [json.dumps({"t": "session", "info": _session_json(s)}) for s in sessions]
        if not frame_lines and not session_lines:
            return
        if self._fd is None and not self._open_next(max(0, len(self.candidates) - 1)):
            raise SpoolError("no writable spool location: " + "; ".join(self.errors[-len(self.candidates):]))
        moved = False
        while True:
            if moved and all_sessions is not None:
                session_lines = [json.dumps({"t": "session", "info": _session_json(s)}) for s in all_sessions()]
            try:
                self._append(("\n".join(session_lines + frame_lines) + "\n").encode())
            except OSError as exc:
                self.errors.append(f"{self.path}: {exc.strerror or exc}")
                last = self._index >= len(self.candidates) - 1
                if last or not self._open_next():
                    self.close()
                    raise SpoolError(f"spool write failed ({'; '.join(self.errors[-2:])})") from exc
                moved = True
                continue
            self.frames += len(frame_lines)
            return

    def _append(self, data: bytes) -> None:
        """Write all of ``data`` or none of it (a partial write is cut back off)."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_spool(path: Path) -> tuple[list[SessionInfo], list[FrameRecord], int]:
    """(sessions, frames, torn lines) of one spool file, in file order."""
    sessions: dict[str, SessionInfo] = {}
    frames: list[FrameRecord] = []
    bad = 0
    with path.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec["t"] == "session":
                    info = _session_from(rec["info"])
                    sessions[info.session_id] = info
                elif rec["t"] == "frame":
                    frames.append(_frame_from(rec))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return list(sessions.values()), frames, bad


def merge_spools(store: Store, db_path: str | Path) -> int:
    """Replay every spool of ``db_path`` into ``store`` and delete it; returns frames merged."""
    total = 0
    for path in spool_candidates(db_path):
        if not path.exists():
            continue
        sessions, frames, bad = read_spool(path)
        rec = Recorder(store)
        for info in sessions:
            known = store.session(info.session_id)
            if known is not None:
                # Frames already stored stay; the spool's later metadata wins.
                info.frame_count = known.frame_count
                info.started_at = min(filter(None, [known.started_at, info.started_at]), default=None)
            else:
                info.frame_count = 0  # counted again from the frames that follow
            rec.open_session(info)
            rec.sessions[info.session_id] = info
            rec.touch(info.session_id)
        for session_id, ts_us, direction, transport, stream, f in frames:
            rec.add(session_id, ts_us, direction, transport, stream, f)
        rec.flush()
        total += len(frames)
        path.unlink()
        msg = f"workbench capture: merged {len(frames)} spooled frames from {path} into {store.path}"
        if bad:
            msg += f" ({bad} torn line(s) skipped)"
        print(msg, file=sys.stderr)
    return total

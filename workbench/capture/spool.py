"""The spool: where capture puts frames when the database cannot be written.

An append-only NDJSON file (one record per line, bytes as hex) next to the database
(``<db>.spool``), or, when that directory is not writable either, under the user's state directory
keyed by a hash of the database path. Records are what the writer would have given the recorder:
``session`` (a SessionInfo row, latest wins) and ``frame`` (session, time, direction, transport,
stream and the classified, already redacted frame). The next capture that can open the database
replays them through a Recorder (so seq numbers continue the sessions already stored) and deletes
the file. A torn last line (a crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
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


class Spool:
    """Append-only writer; ``path`` is the first candidate location that accepts writes."""

    def __init__(self, db_path: str | Path) -> None:
        self.path: Path | None = None
        self._fd: int | None = None
        errors = []
        for cand in spool_candidates(db_path):
            try:
                cand.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self.path = cand
                break
            except OSError as exc:
                errors.append(f"{cand}: {exc.strerror or exc}")
        if self._fd is None:
            raise OSError("no writable spool location: " + "; ".join(errors))
        self.frames = 0

    def write(self, sessions: Iterable[SessionInfo], frames: Iterable[FrameRecord]) -> None:
        lines = [json.dumps({"t": "session", "info": _session_json(s)}) for s in sessions]
        n = len(lines)
        lines += [json.dumps(_frame_json(r)) for r in frames]
        if len(lines) == 0:
            return
        assert self._fd is not None
        # One write per batch: a kill leaves at most one torn line, which the merge skips.
        os.write(self._fd, ("\n".join(lines) + "\n").encode())
        self.frames += len(lines) - n

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

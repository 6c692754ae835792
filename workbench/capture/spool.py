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
that order, through a Recorder in one transaction, keeping each frame's ``seq`` (``merge_spools``: idempotent),
and then deletes them. A torn last line (a crash mid-write) is skipped with a warning.

``BatchSpool`` is the same idea for the writer process's backlog (``backlog.py``): byte records
past a memory bound, read back in order.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from workbench.decode.classify import Frame
from workbench.jsontypes import JsonObject
from workbench.store.db import SessionInfo, Store
from workbench.store.gate import wire_text
from workbench.store.queries import frame_identities
from workbench.store.recorder import Recorder

_FRAME_FIELDS = [f.name for f in fields(Frame)]
_BYTES_FIELDS = {"payload", "raw"}
class FrameRecord(NamedTuple):
    """One frame as the writer hands it over: its session, its ``seq`` there (numbered by the
    writer, so a merge keeps it), time, direction, transport, stream and the classified frame."""

    session_id: str
    seq: int | None
    ts_us: int
    direction: str
    transport: str
    stream: str | None
    frame: Frame


def spool_candidates(db_path: str | Path) -> list[Path]:
    db = Path(db_path).expanduser().absolute()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "workbench" / "spool"
    key = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    return [Path(str(db) + ".spool"), state / f"{db.name}-{key}.spool"]


def _session_json(info: SessionInfo) -> JsonObject:
    d = asdict(info)
    for k in ("started_at", "ended_at"):
        v = d[k]
        d[k] = v.isoformat() if isinstance(v, datetime) else None
    return d


def _session_from(d: JsonObject) -> SessionInfo:
    for k in ("started_at", "ended_at"):
        if d.get(k):
            d[k] = datetime.fromisoformat(d[k])
    return SessionInfo(**d)


def _frame_json(rec: FrameRecord) -> JsonObject:
    f = rec.frame
    fd: JsonObject = {}
    for name in _FRAME_FIELDS:
        v = getattr(f, name)
        fd[name] = v.hex() if name in _BYTES_FIELDS and v is not None else v
    return {"t": "frame", "session_id": rec.session_id, "seq": rec.seq, "ts_us": rec.ts_us,
            "direction": rec.direction, "transport": rec.transport, "stream": rec.stream, "frame": fd}


def _frame_from(d: JsonObject) -> FrameRecord:
    fd = d["frame"]
    for name in _BYTES_FIELDS:
        if fd.get(name) is not None:
            fd[name] = bytes.fromhex(fd[name])
    seq = d.get("seq")  # spools of an earlier workbench carry none: numbered after the stored frames
    return FrameRecord(d["session_id"], int(seq) if seq is not None else None, int(d["ts_us"]), d["direction"],
                       d["transport"], d.get("stream"), Frame(**fd))


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
    """Replay every spool of ``db_path`` into ``store``, then delete them; returns frames merged.

    Every location's records go in ONE transaction, keeping each frame's ``seq``. A frame already
    stored at its (session, seq) with the same time, direction and kind is skipped, so a merge
    interrupted after its commit (before the files were deleted), or a batch that reached the
    database before the spool took it, is merged once. A different frame at that place (the spool
    was written without the database) goes after the session's last frame. When the transaction
    fails nothing is stored and the files stay for the next start (the exception says why).
    """
    paths = [p for p in spool_candidates(db_path) if p.exists()]
    if not paths:
        return 0
    sessions: dict[str, SessionInfo] = {}
    frames: list[FrameRecord] = []
    bad = 0
    for path in paths:
        got, recs, torn = read_spool(path)
        sessions.update({i.session_id: i for i in got})
        frames += recs
        bad += torn
    with store.transaction():
        present = _stored_frames(store, sorted({r.session_id for r in frames} | set(sessions)))
        rec = Recorder(store)
        for info in sessions.values():
            known = store.session(info.session_id)
            if known is not None:  # frames already stored stay; the spool's later metadata wins
                info.started_at = min(filter(None, [known.started_at, info.started_at]), default=None)
            rec.open_session(info)
            rec.sessions[info.session_id] = info
            rec.touch(info.session_id)
        top = {sid: max(seqs, default=-1) for sid, seqs in _by_session(present).items()}
        # A session whose spooled numbering clashes with what is stored (the spool was written
        # without the database) has its new frames numbered after the stored ones, in spool order.
        renumber = {r.session_id for r in frames
                    if r.seq is None or present.get((r.session_id, r.seq), _same(r)) != _same(r)}
        merged = 0
        for r in frames:
            if r.seq is not None and present.get((r.session_id, r.seq)) == _same(r):
                continue  # stored already
            seq = r.seq
            if r.session_id in renumber:
                seq = top[r.session_id] = top.get(r.session_id, -1) + 1
            seq = rec.add(r.session_id, r.ts_us, r.direction, r.transport, r.stream, r.frame, seq=seq)
            # the same frame spooled twice (a writer process restarted after its spool write but
            # before confirming it goes on from the checkpoint before, ``resume.py``) is merged once
            present[(r.session_id, seq)] = _same(r)
            merged += 1
        rec.flush()
        store.recount_frames(list({r.session_id for r in frames} | set(sessions)))
    for path in paths:
        try:
            path.unlink()
        except OSError as exc:  # merged: merging it again on the next start adds nothing
            print(f"workbench capture: merged {path} but could not delete it ({exc.strerror or exc}); "
                  "the next start deletes it", file=sys.stderr)
    msg = (f"workbench capture: merged {merged} spooled frames ({len(frames) - merged} already stored) "
           f"from {', '.join(map(str, paths))} into {store.path}")
    if bad:
        msg += f" ({bad} torn line(s) skipped)"
    print(msg, file=sys.stderr)
    return merged


def _stored_frames(store: Store, session_ids: list[str]) -> dict[tuple[str, int], tuple[int, str, str]]:
    """(session, seq) → (ts µs, direction, kind) of the frames stored for these sessions."""
    if not session_ids:
        return {}
    escaped = {wire_text(s): s for s in session_ids}
    out: dict[tuple[str, int], tuple[int, str, str]] = {}
    for r in frame_identities(store, list(escaped)):
        sid = str(r["session_id"])
        out[(escaped.get(sid, sid), r["seq"])] = (r["ts_us"], r["direction"], r["kind"])
    return out


def _same(r: FrameRecord) -> tuple[int, str, str]:
    """What identifies a spooled frame among the stored ones at its (session, seq)."""
    return r.ts_us, r.direction, r.frame.kind


def _by_session(present: dict[tuple[str, int], Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for sid, seq in present:
        out.setdefault(sid, []).append(seq)
    return out


class BatchSpool:
    """Scratch space on disk for byte records (the writer process's backlog past its bound).

    The records are raw proxy events: wire bytes that may hold credentials. They are written
    encrypted (AES-GCM under a key made for this process and held only in its memory), in one file
    next to the database (``<db>.backlog``; the temporary directory when that cannot be made) that
    is unlinked as soon as it is open: only this process holds it, nothing readable is ever on
    disk, and nothing is left behind whatever way the capture ends (``kill -9`` included). Records
    are appended and read back by (offset, size); ``reset`` gives the space back once every record
    has been read for good.
    """

    NONCE = 12

    def __init__(self, db_path: str | Path) -> None:
        self.candidates = [Path(str(Path(db_path).expanduser().absolute()) + ".backlog")]
        self.path: Path | None = None
        self.size = 0
        self._fd: int | None = None
        self._aead: Any = None
        self._count = 0  # records written: each one's nonce

    def _open(self) -> int:
        # deferred: the cipher loads only when a backlog first goes to disk
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        errors = []
        for cand in [*self.candidates, None]:
            try:
                if cand is None:  # the system's temporary directory (a name no one else can take)
                    fd, name = tempfile.mkstemp(prefix="workbench-", suffix=".backlog")
                    cand = Path(name)
                else:  # a new file only: never one that is there (or a link someone put there)
                    fd = os.open(cand, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                errors.append(f"{cand or tempfile.gettempdir()}: {exc.strerror or exc}")
                continue
            with contextlib.suppress(OSError):
                os.unlink(cand)
            self._fd, self.path = fd, cand
            self._aead = AESGCM(AESGCM.generate_key(256))
            return fd
        raise SpoolError("no place for the backlog spool: " + "; ".join(errors))

    def append(self, data: bytes) -> tuple[int, int]:
        """Write ``data`` at the end (all or nothing: SpoolError); its (offset, size) on disk."""
        fd = self._fd if self._fd is not None else self._open()
        self._count += 1
        nonce = self._count.to_bytes(self.NONCE, "big")  # never reused under this key
        record = nonce + self._aead.encrypt(nonce, data, None)
        at = self.size
        view = memoryview(record)
        try:
            while view:
                n = os.pwrite(fd, view, at + len(record) - len(view))
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[n:]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, at)
            raise SpoolError(f"backlog spool {self.path}: {exc.strerror or exc}") from exc
        self.size = at + len(record)
        return at, len(record)

    def read(self, offset: int, size: int) -> bytes:
        assert self._fd is not None
        record = os.pread(self._fd, size, offset)
        return bytes(self._aead.decrypt(record[:self.NONCE], record[self.NONCE:], None))

    def reset(self) -> None:
        if self._fd is not None and self.size:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
        self.size = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.size = 0

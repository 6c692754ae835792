"""The DuckDB store: one writer, Arrow batch inserts, readers through ``workbench.store.reader``."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from workbench.decode.frame import CARRIED, Frame

# Opening a file has its own home (it loads no pyarrow, for the listing commands); the names stay
# importable from here for the code that always imported them from the store.
from workbench.store.connection import StoreError as StoreError
from workbench.store.connection import check_readable as check_readable
from workbench.store.connection import check_version as check_version
from workbench.store.connection import connect as connect
from workbench.store.connection import damage_message as damage_message
from workbench.store.connection import database_errors_named as database_errors_named
from workbench.store.connection import is_damage as is_damage
from workbench.store.connection import open_message as open_message
from workbench.store.connection import settle
from workbench.store.files import private_files
from workbench.store.gate import gate_frame, gate_meta, text_value, wire_text
from workbench.store.queries import last_seq, session_row
from workbench.store.readonly import fetch_rows
from workbench.store.schema import SchemaVersionError, migrate

DEFAULT_DB = "captures/workbench.duckdb"
# Every table keyed by session, children first (what removing a session touches).
SESSION_TABLES = ("findings", "tool_calls", "blobs", "frames", "sessions")
CHECKPOINT_THRESHOLD = "256MB"

FRAME_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("session_id", pa.string()),
    ("seq", pa.int64()),
    ("ts", pa.timestamp("us")),
    ("direction", pa.string()),
    ("transport", pa.string()),
    ("stream", pa.string()),
    ("kind", pa.string()),
    ("summary", pa.string()),
    ("payload", pa.binary()),
    ("raw", pa.binary()),
    ("flags", pa.uint8()),
    ("msg_type", pa.string()),
    ("size", pa.int32()),
    ("ref_id", pa.int64()),
    ("call_id", pa.string()),
    ("append_seqno", pa.int64()),
    ("request_id", pa.string()),
    ("decoded", pa.string()),
    ("error", pa.string()),
    ("meta", pa.string()),
    ("source_key", pa.string()),
]
FRAME_SCHEMA = pa.schema(FRAME_COLUMNS)
_FRAME_COLS_SQL = ", ".join(name for name, _ in FRAME_COLUMNS)


def now_us() -> int:
    return int(datetime.now(UTC).timestamp() * 1_000_000)


_EPOCH = datetime(1970, 1, 1)


def us_to_datetime(us: int) -> datetime:
    """Naive UTC datetime of a µs timestamp (exact integer arithmetic; called once per frame)."""
    return _EPOCH + timedelta(microseconds=us)


def us_to_time(us: int) -> datetime | str:
    """:func:`us_to_datetime`, or DuckDB's text of the time when no datetime holds it (past year 9999,
    before year 1: a hostile import can stamp a frame so). DuckDB casts either to a TIMESTAMP column,
    so a derived row (a tool call's start) keeps the frame's time instead of ending in a traceback."""
    try:
        return _EPOCH + timedelta(microseconds=us)
    except OverflowError:
        import numpy as np  # loaded already, with pyarrow

        return str(np.datetime64(us, "us")).replace("T", " ")


class FrameBatch:
    """Column lists for one Arrow insert; appending a frame is a handful of list appends."""

    __slots__ = ("session_id", "seq", "ts", "direction", "transport", "stream", "kind", "summary", "payload", "raw", "flags", "msg_type", "size", "ref_id", "call_id", "append_seqno", "request_id", "decoded", "error", "meta", "source_key", "_cols")

    def __init__(self) -> None:
        self.session_id: list[Any] = []
        self.seq: list[Any] = []
        self.ts: list[Any] = []
        self.direction: list[Any] = []
        self.transport: list[Any] = []
        self.stream: list[Any] = []
        self.kind: list[Any] = []
        self.summary: list[Any] = []
        self.payload: list[Any] = []
        self.raw: list[Any] = []
        self.flags: list[Any] = []
        self.msg_type: list[Any] = []
        self.size: list[Any] = []
        self.ref_id: list[Any] = []
        self.call_id: list[Any] = []
        self.append_seqno: list[Any] = []
        self.request_id: list[Any] = []
        self.decoded: list[Any] = []
        self.error: list[Any] = []
        self.meta: list[Any] = []
        self.source_key: list[Any] = []
        self._cols: list[list[Any]] = [self.session_id, self.seq, self.ts, self.direction, self.transport, self.stream, self.kind, self.summary, self.payload, self.raw, self.flags, self.msg_type, self.size, self.ref_id, self.call_id, self.append_seqno, self.request_id, self.decoded, self.error, self.meta, self.source_key]

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, session_id: str, seq: int, ts_us: int, direction: str, transport: str,
            stream: str | None, f: Frame, decoded: str | None = None, source_key: str | None = None) -> None:
        """``source_key``: identity of the recorded unit the frame came from (imports; unique).

        Every frame passes the write gate here (``workbench.store.gate``: credentials redacted,
        also inside compressed payloads), whichever source adds it.
        """
        # ``carried`` matters only to a malformed frame: no lookup for the others
        f = gate_frame(f, carried=CARRIED.get((transport, direction)) if f.kind == "malformed" else None)
        self.session_id.append(session_id)
        self.seq.append(seq)
        self.ts.append(ts_us)
        self.direction.append(direction)
        self.transport.append(transport)
        self.stream.append(stream)
        self.kind.append(f.kind)
        self.summary.append(f.summary)
        payload = f.payload
        self.payload.append(payload)
        self.raw.append(f.raw)
        flags = f.flags
        self.flags.append(flags if flags >= 0 else 0)
        self.msg_type.append(f.msg_type)
        self.size.append(len(payload))
        self.ref_id.append(f.ref_id)
        self.call_id.append(f.call_id)
        self.append_seqno.append(f.append_seqno)
        self.request_id.append(f.request_id)
        self.decoded.append(decoded)
        self.error.append(f.error)
        self.meta.append(json_text(f.meta) if f.meta else None)
        self.source_key.append(source_key)

    def to_arrow(self) -> pa.Table:
        arrays = [_arrow_column(col, typ, name) for col, (name, typ) in zip(self._cols, FRAME_COLUMNS, strict=True)]
        return pa.Table.from_arrays(arrays, schema=FRAME_SCHEMA)

    def clear(self) -> None:
        for col in self._cols:
            col.clear()


def json_text(value: Any) -> str:
    """JSON of a frame's or session's meta, its strings stored by the gate's wire-text rule."""
    text = json.dumps(value)
    if "\\" in text:  # a backslash or a lone surrogate (bytes that were not UTF-8) in some string
        text = json.dumps(text_value(value))
    return text


def _json_value_text(v: str) -> str:
    try:
        return json_text(json.loads(v))
    except ValueError:  # not JSON after all: plain text then
        return wire_text(v)


# Frame columns holding JSON documents: escaped inside (``json_text``), never as text.
_JSON_COLUMNS = frozenset({"meta", "decoded"})
_ESCAPE_HINT = r"\\[\\x]"  # a backslash before a backslash or an x: the rule doubles its backslashes


def _arrow_column(col: list[Any], typ: pa.DataType, name: str) -> pa.Array:
    """One Arrow column; text by the gate's wire-text rule (``wire_text``), value by value.

    The rule's work is done only for the values that need it: the column converts as is when
    it holds no lone surrogate, and a vectorised match finds the rare value holding a backslash
    followed by a backslash or an x.

    A column holding one value throughout (a batch's session, direction, transport and stream
    are mostly one; a frame's raw, error, meta… mostly None) is that value converted once (the
    same rules) and repeated, when it is text or None: ≈ 2 ns a row instead of ≈ 20 for a string, about a tenth of what
    turning a batch into Arrow costs. ``list.count`` compares by identity first, so checking is
    cheaper still, and a column whose last value differs from its first is not checked at all.
    """
    n = len(col)
    if n > 1:
        first = col[0]
        last = col[-1]
        # None and text only: a number column could hold ``True`` next to an equal ``1``, which
        # pyarrow refuses (a str equals nothing but a str, None only itself)
        if (first is None or type(first) is str) and (last is first or last == first) and col.count(first) == n:
            if first is None:
                return pa.nulls(n, typ)
            return pa.repeat(_arrow_values([first], typ, name)[0], n)
    return _arrow_values(col, typ, name)


def _arrow_values(col: list[Any], typ: pa.DataType, name: str) -> pa.Array:
    """:func:`_arrow_column` value by value."""
    try:
        arr = pa.array(col, type=typ)
    except (UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError):
        if typ != pa.string():
            raise
        fix = _json_value_text if name in _JSON_COLUMNS else wire_text
        return pa.array([fix(v) if isinstance(v, str) else v for v in col], type=typ)
    if typ != pa.string() or name in _JSON_COLUMNS or not len(arr):
        return arr
    # No backslash anywhere in the column's text (nearly always): nothing to match. One search of
    # the data buffer costs a fraction of the regex over each value.
    data = arr.buffers()[2]
    if data is None or data.to_pybytes().find(b"\\") < 0:
        return arr
    # deferred: pyarrow.compute costs ≈ 20 ms at start-up; only a column holding a backslash gets here
    import pyarrow.compute as pc

    if pc.any(pc.match_substring_regex(arr, _ESCAPE_HINT)).as_py():
        return pa.array([wire_text(v) if isinstance(v, str) else v for v in col], type=typ)
    return arr


@dataclass
class SessionInfo:
    """A row of ``sessions``; the writer keeps frame_count and the time bounds current."""

    session_id: str
    source: str = "capture"
    transport: str | None = None
    request_id: str | None = None
    conversation_id: str | None = None
    model: str | None = None
    client_version: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    frame_count: int = 0
    status: str = "open"
    host: str | None = None
    path: str | None = None
    http_status: int | None = None
    auth_hash: str | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    label: str | None = None  # scenario name, or an excerpt of the first user prompt

    def row(self) -> list[Any]:
        """The row as stored: through the write gate (credential headers in ``meta`` redacted,
        wire text valid UTF-8)."""
        d = {k: wire_text(v) if isinstance(v, str) else v for k, v in asdict(self).items()}
        meta = gate_meta(self.meta)
        d["meta"] = json_text(meta) if meta else None  # escaped inside, by the same rule
        return list(d.values())


SESSION_FIELDS = list(SessionInfo.__dataclass_fields__)
SESSION_TYPES = [pa.string(), pa.string(), pa.string(), pa.string(), pa.string(), pa.string(), pa.string(),
                 pa.timestamp("us"), pa.timestamp("us"), pa.int64(), pa.string(), pa.string(), pa.string(),
                 pa.int32(), pa.string(), pa.string(), pa.string(), pa.string()]


class Store:
    """Read-write access to one capture database (the single writer).

    It is also a ``Reader`` (``workbench.store.queries``) of its own file, never a live one.
    """

    live = False

    def __init__(self, path: str | Path = DEFAULT_DB, *, read_only: bool = False) -> None:
        self.path = str(path)
        self.read_only = read_only
        if self.path != ":memory:" and not read_only:
            private_files()  # the database and its WAL (re-created at each checkpoint): 0600
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if read_only and self.path != ":memory:" and not Path(self.path).exists():
            raise StoreError(f"{self.path}: no such capture database")
        self.con = connect(self.path, read_only=read_only)
        self.lock = threading.RLock()
        self._tx_depth = 0
        try:
            if not read_only:
                migrate(self.con, self.path)
                # Frames are committed to the WAL in small batches; checkpointing every 16 MB
                # (the default) writes every byte twice while a capture streams. The WAL is
                # replayed on the next open, so durability is the same.
                self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
            else:
                check_version(self.con, self.path)
            settle(self.con)
        except (SchemaVersionError, duckdb.Error) as exc:
            self.con.close()
            raise StoreError(str(exc) if isinstance(exc, SchemaVersionError)
                             else damage_message(self.path, exc) if is_damage(exc)
                             else f"{self.path}: cannot prepare the database: {exc}") from exc

    # writing ---------------------------------------------------------------------------------

    def insert_frames(self, batch: FrameBatch | pa.Table) -> int:
        table = batch.to_arrow() if isinstance(batch, FrameBatch) else batch
        if not table.num_rows:
            return 0
        with self.lock:
            self.con.register("_wb_frames_in", table)
            try:
                self.con.execute(f"INSERT INTO frames ({_FRAME_COLS_SQL}) SELECT * FROM _wb_frames_in")
            finally:
                self.con.unregister("_wb_frames_in")
        return int(table.num_rows)

    def upsert_sessions(self, sessions: Iterable[SessionInfo]) -> None:
        rows = [s.row() for s in sessions]
        if not rows:
            return
        table = pa.Table.from_arrays(
            [pa.array(col, type=typ) for col, typ in zip(zip(*rows, strict=True), SESSION_TYPES, strict=True)],
            names=SESSION_FIELDS)
        cols = ", ".join(SESSION_FIELDS)
        with self.lock:
            self.con.register("_wb_sessions_in", table)
            try:
                self.con.execute(f"INSERT OR REPLACE INTO sessions ({cols}) SELECT {cols} FROM _wb_sessions_in")
            finally:
                self.con.unregister("_wb_sessions_in")

    def insert_rows(self, table: str, rows: pa.Table, replace_sessions: Sequence[str] = ()) -> None:
        """Replace a derived table's rows for some sessions (blobs, tool_calls, findings)."""
        with self.transaction():  # joins the caller's transaction when there is one
            if replace_sessions:
                self.con.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT unnest(?))",
                                 [list(replace_sessions)])
            if rows.num_rows:
                self.con.register("_wb_rows_in", rows)
                try:
                    cols = ", ".join(rows.column_names)
                    self.con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _wb_rows_in")
                finally:
                    self.con.unregister("_wb_rows_in")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes inside commit together or not at all (an import batch: frames, sessions, deletions).

        Only the writer connection takes part: ``query()`` runs on a cursor of its own. Nested
        uses join the outer transaction (a recorder flushing inside an importer's transaction).
        """
        with self.lock:
            if self._tx_depth:
                self._tx_depth += 1
                try:
                    yield
                finally:
                    self._tx_depth -= 1
                return
            self.con.execute("BEGIN")
            self._tx_depth = 1
            try:
                yield
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    self.con.execute("ROLLBACK")
                raise
            finally:
                self._tx_depth = 0
            self.con.execute("COMMIT")

    def commit_batch(self, frames: FrameBatch | pa.Table | None, sessions: Sequence[SessionInfo],
                     meta_updates: Sequence[tuple[str | None, str, int]] = ()) -> int:
        """Frames, their sessions' rows and late frame-meta updates, in ONE transaction.

        A failure leaves none of them stored, so a batch the caller spools again is never half
        in the database. Returns the number of frames inserted.
        """
        with self.transaction():
            n = self.insert_frames(frames) if frames is not None else 0
            self.upsert_sessions(sessions)
            if meta_updates:
                self.con.executemany("UPDATE frames SET meta = ? WHERE session_id = ? AND seq = ?",
                                     [(m, wire_text(s), q) for m, s, q in meta_updates])
        return n

    def delete_sessions(self, session_ids: Sequence[str], tables: Sequence[str] = SESSION_TABLES) -> None:
        """Remove sessions' rows from ``tables`` on the writer connection (inside ``transaction()``)."""
        if not session_ids:
            return
        with self.lock:
            for table in tables:
                self.con.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT unnest(?))", [list(session_ids)])

    def recount_frames(self, session_ids: Sequence[str]) -> None:
        """Set sessions' ``frame_count`` to the frames stored (after a merge that skipped copies)."""
        if not session_ids:
            return
        with self.lock:
            self.con.execute("UPDATE sessions SET frame_count = c.n FROM (SELECT session_id, count(*) AS n FROM frames "
                             "WHERE session_id IN (SELECT unnest(?)) GROUP BY 1) c "
                             "WHERE sessions.session_id = c.session_id", [[wire_text(s) for s in session_ids]])

    def close_open_sessions(self, source: str, error: str) -> None:
        """Sessions of ``source`` still ``open`` become ``incomplete`` (their writer is gone)."""
        with self.lock:
            self.con.execute("UPDATE sessions SET status = 'incomplete', error = coalesce(error, ?) "
                             "WHERE status = 'open' AND source = ?", [error, source])

    def warm_up(self) -> None:
        """Pay the first insert's one-time cost (lazy Arrow/DuckDB set-up) now; stores nothing."""
        with self.lock:
            batch = FrameBatch()
            batch.add("warm-up", 0, 0, "server", "run", None, Frame("empty", "", b""))
            self.con.register("_wb_warm", batch.to_arrow())
            try:
                self.con.execute("INSERT INTO frames SELECT * FROM _wb_warm WHERE false")
            finally:
                self.con.unregister("_wb_warm")
            cols = ", ".join(SESSION_FIELDS)
            self.con.execute("BEGIN")
            try:
                self.con.execute(f"INSERT OR REPLACE INTO sessions ({cols}) VALUES ({', '.join('?' for _ in SESSION_FIELDS)})",
                                 SessionInfo("warm-up").row())
            finally:
                self.con.execute("ROLLBACK")

    def set_meta(self, key: str, value: str) -> None:
        """Set one entry of the ``meta`` table (a mark such as the demo's, read back by ``meta_keys_and_rows``)."""
        with self.lock:
            self.con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    def checkpoint(self) -> None:
        with self.lock:
            self.con.execute("CHECKPOINT")

    # reading ---------------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self.lock:
            cur = self.con.cursor()
            try:
                return _arrow(cur, sql, params)
            finally:
                cur.close()

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        with self.lock:
            cur = self.con.cursor()
            try:
                return fetch_rows(cur.execute(sql, list(params) if params else None))
            finally:
                cur.close()

    def session(self, session_id: str) -> SessionInfo | None:
        row = session_row(self, wire_text(session_id), SESSION_FIELDS)
        if row is None:
            return None
        row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
        return SessionInfo(**row)

    def next_seq(self, session_id: str) -> int:
        return last_seq(self, wire_text(session_id)) + 1

    def close(self) -> None:
        with self.lock:
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _arrow(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None) -> pa.Table:
    """Run a query and return Arrow (a statement with no result gives an empty table)."""
    rel = con.sql(sql, params=list(params) if params else None)
    if rel is None:
        return pa.table({})
    return rel.to_arrow_table()



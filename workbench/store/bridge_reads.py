"""The reads (and the one write) of the bridge's two sides: one named function per question.

``analysis.bridge_join`` links each OpenAI request to the agent runs it caused or answered,
``analysis.bridge`` compares the two sides, ``tui.bridge_screen`` shows them side by side; every
SQL text they need is here, over one reader type (``store.queries.Reader``). Which transports are
which side is the analysis's choice and comes in as arguments. Reads other parts share are reused
from ``store.queries`` and ``store.analysis_reads`` (a session's row, a first payload, ``meta``
values under a prefix).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from workbench.store.queries import Reader, Row

if TYPE_CHECKING:  # annotations only: a listing reads through here and loads no pyarrow
    from workbench.store.db import Store


def _rows(reader: Reader, sql: str, params: Sequence[object]) -> list[Row]:
    return reader.rows(sql, list(params))


# sessions ----------------------------------------------------------------------------------------

def has_sessions_of(reader: Reader, transports: Sequence[str]) -> bool:
    """Does the database hold any session of these transports?"""
    rows = _rows(reader, "SELECT EXISTS (SELECT 1 FROM sessions WHERE transport IN (SELECT unnest(?))) AS held",
                 [list(transports)])
    return bool(rows[0]["held"])


def session_window(reader: Reader, session_id: str) -> Row | None:
    """A session's transport, status, model, ``start_us``, ``end_us`` and ``last_us`` (its last
    frame's time: a session still open has no end), or None for an unknown session."""
    rows = _rows(reader, "SELECT session_id, transport, status, model, epoch_us(started_at) AS start_us, "
                         "epoch_us(ended_at) AS end_us, (SELECT max(epoch_us(ts)) FROM frames f "
                         "WHERE f.session_id = s.session_id) AS last_us FROM sessions s WHERE session_id = ?",
                 [session_id])
    return rows[0] if rows else None


def session_span(reader: Reader, session_id: str) -> Row | None:
    """A session's status, error, HTTP status, transport, ``meta`` (JSON text) and its start and
    end as ``start_us`` / ``end_us``; None for an unknown session."""
    rows = _rows(reader, "SELECT status, error, http_status, transport, CAST(meta AS VARCHAR) AS meta, "
                         "epoch_us(started_at) AS start_us, epoch_us(ended_at) AS end_us FROM sessions "
                         "WHERE session_id = ?", [session_id])
    return rows[0] if rows else None


def session_metas(reader: Reader, session_ids: Sequence[str]) -> list[str | None]:
    """The ``meta`` (JSON text) of each stored session of ``session_ids``."""
    return [r["meta"] for r in _rows(reader, "SELECT CAST(meta AS VARCHAR) AS meta FROM sessions "
                                             "WHERE session_id IN (SELECT unnest(?))", [list(session_ids)])]


def transports_by_start(reader: Reader, session_ids: Sequence[str]) -> dict[str, str | None]:
    """session_id → transport of the stored sessions of ``session_ids``, in start order."""
    rows = _rows(reader, "SELECT session_id, transport FROM sessions WHERE session_id IN (SELECT unnest(?)) "
                         "ORDER BY started_at, session_id", [list(session_ids)])
    return {str(r["session_id"]): r["transport"] for r in rows}


def sessions_started_between(reader: Reader, transports: Sequence[str], start_us: int, end_us: int) -> list[Row]:
    """(session_id, model) of the sessions of these transports that started within
    ``start_us``..``end_us`` (inclusive), in start order."""
    return _rows(reader, "SELECT session_id, model FROM sessions WHERE transport IN (SELECT unnest(?)) "
                         "AND epoch_us(started_at) BETWEEN ? AND ? ORDER BY started_at, session_id",
                 [list(transports), start_us, end_us])


def sessions_open_at(reader: Reader, transports: Sequence[str], at_us: int) -> list[str]:
    """The sessions of these transports that had started and not yet ended at ``at_us`` (one
    without an end counts as open)."""
    return [str(r["session_id"]) for r in _rows(
        reader, "SELECT session_id FROM sessions WHERE transport IN (SELECT unnest(?)) AND "
                "epoch_us(started_at) <= ? AND coalesce(epoch_us(ended_at), ?) >= ? ORDER BY session_id",
        [list(transports), at_us, at_us, at_us])]


# frames ------------------------------------------------------------------------------------------

def call_ids_of(reader: Reader, session_ids: Sequence[str], directions: Sequence[str]) -> list[tuple[str, str]]:
    """(session_id, call_id) of every distinct call id the sessions' frames of ``directions`` carry."""
    if not session_ids:
        return []
    rows = _rows(reader, "SELECT DISTINCT session_id, call_id FROM frames WHERE session_id IN (SELECT unnest(?)) "
                         "AND call_id IS NOT NULL AND direction IN (SELECT unnest(?))",
                 [list(session_ids), list(directions)])
    return [(str(r["session_id"]), str(r["call_id"])) for r in rows]


def sessions_with_call_ids(reader: Reader, call_ids: Sequence[str], transports: Sequence[str],
                           exclude: str | None = None) -> list[str]:
    """The sessions of these transports with a frame carrying one of ``call_ids`` (but ``exclude``)."""
    rows = _rows(reader, "SELECT DISTINCT session_id FROM frames WHERE call_id IN (SELECT unnest(?)) "
                         "AND transport IN (SELECT unnest(?)) AND session_id IS DISTINCT FROM ? ORDER BY session_id",
                 [list(call_ids), list(transports), exclude])
    return [str(r["session_id"]) for r in rows]


def sessions_whose_frame_mentions(reader: Reader, kind: str, text: str, transports: Sequence[str],
                                  since_us: int) -> list[str]:
    """The sessions of these transports, started at ``since_us`` or later, with a ``kind`` frame whose
    payload holds ``text`` (a candidate only: the caller parses the payload to be sure)."""
    rows = _rows(reader, "SELECT DISTINCT f.session_id FROM frames f JOIN sessions s USING (session_id) "
                         "WHERE f.kind = ? AND s.transport IN (SELECT unnest(?)) AND epoch_us(s.started_at) >= ? "
                         "AND contains(CAST(f.payload AS VARCHAR), ?) ORDER BY f.session_id",
                 [kind, list(transports), since_us, text])
    return [str(r["session_id"]) for r in rows]


def side_frames(reader: Reader, session_id: str, payload_kinds: Sequence[str]) -> list[Row]:
    """(seq, ts, direction, kind, call_id, payload) of every frame of a session in seq order, ``ts``
    in µs; ``payload`` only for client frames and ``payload_kinds`` (else None)."""
    return _rows(reader, "SELECT seq, epoch_us(ts) AS ts, direction, kind, call_id, "
                         "CASE WHEN list_contains(?::VARCHAR[], kind) OR direction = 'client' THEN payload END AS payload "
                         "FROM frames WHERE session_id = ? ORDER BY seq", [list(payload_kinds), session_id])


def frames_with_payloads(reader: Reader, session_id: str) -> list[Row]:
    """(seq, ts, direction, kind, call_id, payload) of every frame of a session in seq order, ``ts``
    in µs (an OpenAI exchange: a request and its answer's events, a few hundred frames)."""
    return _rows(reader, "SELECT seq, epoch_us(ts) AS ts, direction, kind, call_id, payload FROM frames "
                         "WHERE session_id = ? ORDER BY seq", [session_id])


def frame_lines(reader: Reader, session_id: str) -> list[Row]:
    """(seq, ts, direction, kind, summary) of every frame of a session in seq order, ``ts`` in µs."""
    return _rows(reader, "SELECT seq, epoch_us(ts) AS ts, direction, kind, summary FROM frames "
                         "WHERE session_id = ? ORDER BY seq", [session_id])


# the links, stored in ``meta`` -------------------------------------------------------------------

def write_meta_values(store: Store, prefix: str, values: Mapping[str, str | None]) -> None:
    """Set ``meta[prefix || session_id]`` to each value, or delete the key for None (one
    transaction: a reader sees the old links or the new ones). Read back with
    ``analysis_reads.stamp_values``."""
    gone = [prefix + sid for sid, value in values.items() if value is None]
    rows = [[prefix + sid, value] for sid, value in values.items() if value is not None]
    with store.transaction():
        if gone:
            store.con.execute("DELETE FROM meta WHERE key IN (SELECT unnest(?))", [gone])
        if rows:
            store.con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)

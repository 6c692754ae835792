"""The DuckDB schema: a public interface (notebooks and users' SQL depend on it).

Versioned with forward-only migrations. A database written by a newer workbench is refused rather
than silently misread. Documented in the README ("Database schema").
"""

from __future__ import annotations

import json
import logging

import duckdb

from workbench.errors import WorkbenchError

log = logging.getLogger("workbench.store")

SCHEMA_VERSION = 3

# A statement that splits one migration into two transactions.
COMMIT_POINT = "-- commit"
_NDJSON_LINE = """coalesce(decoded->>'$."$line"', nullif(regexp_extract(error, '^line (\\d+):', 1), ''))"""
_FLOW_IMPORTS = "SELECT session_id FROM sessions WHERE source = 'import:flow'"
_NDJSON_IMPORTS = "SELECT session_id FROM sessions WHERE source = 'import:ndjson'"
_RENUMBER = """UPDATE frames SET seq = r.new_seq FROM (
        SELECT rowid AS rid, row_number() OVER (PARTITION BY session_id ORDER BY seq) - 1 AS new_seq
        FROM frames WHERE session_id IN (SELECT session_id FROM _m3_touched)) r
    WHERE frames.rowid = r.rid AND frames.seq <> r.new_seq"""

MIGRATION_3 = [
    """ALTER TABLE frames ADD COLUMN IF NOT EXISTS source_key VARCHAR""",
    """CREATE TEMP TABLE _m3_report (item VARCHAR, n BIGINT)""",
    """CREATE TEMP TABLE _m3_touched (session_id VARCHAR)""",
    # Keys of earlier flow imports, as today's importer writes them, so re-importing adds nothing
    # twice. (Earlier HAR and NDJSON imports cannot get theirs back: they are recognised by the
    # file hash, as before.)
    f"""UPDATE frames SET source_key = k.key FROM (
            SELECT rowid AS rid, 'flow:' || stream || '#'
                   || (row_number() OVER (PARTITION BY session_id, stream ORDER BY direction = 'server', seq) - 1) AS key
            FROM frames WHERE source_key IS NULL AND stream IS NOT NULL AND session_id IN ({_FLOW_IMPORTS})) k
        WHERE frames.rowid = k.rid""",
    # Reported only: NDJSON lines an earlier workbench imported more than once (a grown file).
    f"""INSERT INTO _m3_report SELECT 'ndjson_lines_stored_more_than_once', coalesce(sum(n - 1), 0) FROM (
            SELECT count(*) AS n FROM frames
            WHERE transport = 'cli_ndjson' AND session_id IN ({_NDJSON_IMPORTS})
            GROUP BY session_id, {_NDJSON_LINE}, payload HAVING count(*) > 1)""",
    # A flow joined to two sessions by earlier imports keeps its key in the first one only.
    """CREATE TEMP TABLE _m3_shared AS SELECT rid FROM (
            SELECT rowid AS rid, row_number() OVER (PARTITION BY source_key ORDER BY session_id, seq) AS rn
            FROM frames WHERE source_key LIKE 'flow:%') WHERE rn > 1""",
    """INSERT INTO _m3_report SELECT 'flow_frames_left_without_key', count(*) FROM _m3_shared""",
    """UPDATE frames SET source_key = NULL WHERE rowid IN (SELECT rid FROM _m3_shared)""",
    # (session_id, seq) used twice: drop exact copies; other rows move after the session's last frame.
    """CREATE TEMP TABLE _m3_seq AS SELECT session_id, seq FROM frames GROUP BY ALL HAVING count(*) > 1""",
    """CREATE TEMP TABLE _m3_copies AS SELECT rid FROM (
            SELECT f.rowid AS rid, row_number() OVER (
                PARTITION BY f.session_id, f.seq, f.direction, f.kind, f.stream, f.ts, f.payload, f.raw ORDER BY f.rowid) AS rn
            FROM frames f SEMI JOIN _m3_seq USING (session_id, seq)) WHERE rn > 1""",
    """INSERT INTO _m3_report SELECT 'exact_copies_removed', count(*) FROM _m3_copies""",
    """DELETE FROM frames WHERE rowid IN (SELECT rid FROM _m3_copies)""",
    """CREATE TEMP TABLE _m3_moved AS SELECT d.rid, d.session_id,
            x.mx + row_number() OVER (PARTITION BY d.session_id ORDER BY d.seq, d.rid) AS new_seq
        FROM (SELECT f.rowid AS rid, f.session_id, f.seq,
                     row_number() OVER (PARTITION BY f.session_id, f.seq ORDER BY f.rowid) AS rn
              FROM frames f SEMI JOIN _m3_seq USING (session_id, seq)) d
        JOIN (SELECT session_id, max(seq) AS mx FROM frames GROUP BY 1) x USING (session_id)
        WHERE d.rn > 1""",
    """INSERT INTO _m3_report SELECT 'frames_moved_to_a_new_seq', count(*) FROM _m3_moved""",
    """UPDATE frames SET seq = m.new_seq FROM _m3_moved m WHERE frames.rowid = m.rid""",
    """INSERT INTO _m3_touched SELECT DISTINCT session_id FROM _m3_seq""",
    # Sessions that changed: seqs dense again, counts right, derived rows dropped (diagnose rebuilds them).
    _RENUMBER,
    """UPDATE sessions SET frame_count = c.n FROM (
            SELECT session_id, count(*) AS n FROM frames WHERE session_id IN (SELECT session_id FROM _m3_touched)
            GROUP BY 1) c
        WHERE sessions.session_id = c.session_id""",
    """DELETE FROM findings WHERE session_id IN (SELECT session_id FROM _m3_touched)""",
    """DELETE FROM tool_calls WHERE session_id IN (SELECT session_id FROM _m3_touched)""",
    """DELETE FROM blobs WHERE session_id IN (SELECT session_id FROM _m3_touched)""",
    """INSERT INTO _m3_report SELECT 'sessions_changed', count(DISTINCT session_id) FROM _m3_touched""",
    """INSERT OR REPLACE INTO meta SELECT 'migration_3', CAST(json_group_object(item, n) AS VARCHAR) FROM _m3_report
        HAVING sum(n) > 0""",
    # DuckDB builds an index only in a transaction without pending updates. Every step above is
    # idempotent, so a crash between the two transactions just repeats the migration.
    COMMIT_POINT,
    """CREATE UNIQUE INDEX IF NOT EXISTS frames_session_seq ON frames (session_id, seq)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS frames_source_key ON frames (source_key)""",
    """DROP TABLE _m3_report""", """DROP TABLE _m3_touched""", """DROP TABLE _m3_shared""",
    """DROP TABLE _m3_seq""", """DROP TABLE _m3_copies""", """DROP TABLE _m3_moved""",
]

# Each entry upgrades from version i to i + 1 (index 0 creates version 1).
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS sessions (
            session_id VARCHAR PRIMARY KEY,
            source VARCHAR,            -- capture | client | sim | import:flow | import:har | import:ndjson | fixture | parquet
            transport VARCHAR,         -- run | runsse | runpoll | unary | cli_ndjson
            request_id VARCHAR,
            conversation_id VARCHAR,
            model VARCHAR,
            client_version VARCHAR,
            started_at TIMESTAMP,
            ended_at TIMESTAMP,
            frame_count BIGINT,
            status VARCHAR,            -- open | complete | incomplete | error | aborted
            host VARCHAR,
            path VARCHAR,
            http_status INTEGER,
            auth_hash VARCHAR,         -- short hash of the bearer token, never the token
            error VARCHAR,
            meta JSON
        )""",
        """CREATE TABLE IF NOT EXISTS frames (
            session_id VARCHAR NOT NULL,
            seq BIGINT NOT NULL,       -- 0,1,2,… in wire order within the session (both directions)
            ts TIMESTAMP NOT NULL,     -- UTC, when the frame completed on the wire
            direction VARCHAR NOT NULL,  -- client (client→server) | server (server→client)
            transport VARCHAR NOT NULL,  -- run | runsse | bidi_append | runpoll | unary | cli_ndjson
            stream VARCHAR,            -- h2 stream / HTTP request the frame came on
            kind VARCHAR NOT NULL,
            summary VARCHAR,
            payload BLOB,              -- the agent message after de-enveloping and unwrapping
            raw BLOB,                  -- wrapper bytes (BidiAppend / BidiPoll) when they differ
            flags UTINYINT,            -- envelope flags (0x01 gzip, 0x02 end-stream, 0x80 trailer)
            msg_type VARCHAR,          -- protobuf full name of payload, when known
            size INTEGER,
            ref_id BIGINT,             -- exec / KV / interaction id
            call_id VARCHAR,           -- tool call id
            append_seqno BIGINT,       -- BidiAppend append_seqno / RunPoll seqno
            request_id VARCHAR,
            decoded JSON,              -- named tree; NULL until somebody asks (see workbench frames --json)
            error VARCHAR
        )""",
        """CREATE TABLE IF NOT EXISTS blobs (
            session_id VARCHAR NOT NULL,
            blob_id VARCHAR NOT NULL,  -- hex
            op VARCHAR NOT NULL,       -- set | get
            seq BIGINT,                -- frame carrying the request
            result_seq BIGINT,         -- frame carrying the client's answer
            kv_id BIGINT,
            size INTEGER,
            content_type VARCHAR,      -- json | text | protobuf | binary | empty
            role VARCHAR,              -- system | user | assistant | tool (JSON messages)
            proto_type VARCHAR,        -- overlay type that fits a protobuf blob
            parts JSON,                -- content parts: text, tool-call {name,args}, tool-result
            sha256_ok BOOLEAN,         -- blob id == SHA-256(data)
            checkpoint_ref VARCHAR,    -- checkpoint field referencing this id, if any
            status VARCHAR,            -- stored | served | miss | empty | unanswered | never_set
            preview VARCHAR,
            data BLOB
        )""",
        """CREATE TABLE IF NOT EXISTS tool_calls (
            session_id VARCHAR NOT NULL,
            call_id VARCHAR NOT NULL,
            tool_name VARCHAR,
            exec_id BIGINT,
            model_call_id VARCHAR,
            first_seq BIGINT,
            last_seq BIGINT,
            exec_seq BIGINT,
            result_seq BIGINT,
            args_streamed JSON,
            args_completion JSON,
            args_merged JSON,
            args_naive VARCHAR,
            result JSON,
            status VARCHAR,
            started_at TIMESTAMP,
            ended_at TIMESTAMP
        )""",
        """CREATE TABLE IF NOT EXISTS findings (
            session_id VARCHAR NOT NULL,
            code VARCHAR NOT NULL,
            severity VARCHAR NOT NULL,  -- info | warning | error
            message VARCHAR,
            first_seq BIGINT,
            last_seq BIGINT,
            evidence BIGINT[],
            suggested_fix VARCHAR,
            created_at TIMESTAMP DEFAULT current_timestamp
        )""",
    ],
    # 2: per-frame metadata of the exchange that carried a frame (a BidiAppend's HTTP status and
    # redacted request headers, a gRPC-Web trailer's fields, ...) and a human label per session.
    [
        """ALTER TABLE frames ADD COLUMN IF NOT EXISTS meta JSON""",
        """ALTER TABLE sessions ADD COLUMN IF NOT EXISTS label VARCHAR""",
    ],
    # 3: nothing written twice. frames.source_key names the recorded unit an imported frame came
    # from (``flow:<flow id>#<n>``, ``har:<entry hash>#<n>``, ``ndjson:<lineage>:<line>:<line hash>#0``,
    # ``fixture:<hash>#<n>``, or the exported key of a Parquet row; NULL for live recordings), and
    # two unique indexes make a duplicate frame impossible by any path. Older files are brought in
    # line first (docs/import.md "Re-imports and interrupted imports"): keys are derived for earlier
    # flow imports, and a (session_id, seq) used twice keeps both rows (exact copies excepted).
    # What was changed or found is counted in meta 'migration_3'.
    MIGRATION_3,
]


class SchemaVersionError(WorkbenchError):
    pass


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta' AND table_schema = 'main'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(con: duckdb.DuckDBPyConnection, path: str = "") -> int:
    """Bring the database to SCHEMA_VERSION; returns the version found before."""
    found = current_version(con)
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path or 'database'}: schema version {found} is newer than this workbench ({SCHEMA_VERSION})"
        )
    for version in range(found, SCHEMA_VERSION):
        con.execute("BEGIN")
        for stmt in MIGRATIONS[version]:
            if stmt == COMMIT_POINT:
                con.execute("COMMIT")
                con.execute("BEGIN")
            else:
                con.execute(stmt)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(version + 1)])
        con.execute("COMMIT")
        if version + 1 == 3:
            _report_migration_3(con, path)
    return found


def _report_migration_3(con: duckdb.DuckDBPyConnection, path: str) -> None:
    """Say on stderr (via logging) what bringing an older file in line with the unique keys changed."""
    row = con.execute("SELECT value FROM meta WHERE key = 'migration_3'").fetchall()
    try:
        report = {k: int(v) for k, v in json.loads(row[0][0]).items()} if row and row[0][0] else {}
    except (ValueError, TypeError, AttributeError):
        return
    changed = {k: v for k, v in report.items() if v}
    if changed:
        log.warning("%s: upgraded to schema 3 (unique frame keys): %s; details in meta 'migration_3'",
                    path or "database", ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in changed.items()))

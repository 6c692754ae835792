"""The DuckDB schema: a public interface (notebooks and users' SQL depend on it).

Versioned with forward-only migrations. A database written by a newer workbench is refused rather
than silently misread. Documented in the README ("Database schema").
"""

from __future__ import annotations

import duckdb

from workbench.errors import WorkbenchError

SCHEMA_VERSION = 2

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
            con.execute(stmt)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(version + 1)])
        con.execute("COMMIT")
    return found

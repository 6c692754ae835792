"""The reads an OpenTelemetry export makes (``workbench.otel``): one named function per question.

Each answer is bounded by the session's structure, not its length: a 1M-frame session gives one
row per model turn (the GROUP BY below), per exec and per tool call, never a row per delta or
heartbeat. Times are epoch µs.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.protocol import kinds
from workbench.store.queries import Reader, Row

# What the client sends that the model answers: a prompt (run_request, a follow-up action) or the
# first result of an exec. A new model turn (a ``chat`` span) starts at each.
_PROMPT_KINDS = (kinds.RUN_REQUEST, kinds.FOLLOWUP_ACTION)
# What counts as the model's output (the first one after an input is the turn's first chunk).
_CHUNK_KINDS = (kinds.TEXT_DELTA, kinds.TOKEN_DELTA, kinds.THINKING_DELTA, kinds.PARTIAL_TOOL_CALL,
                kinds.TOOL_CALL_STARTED, kinds.TOOL_CALL_DELTA, *kinds.OPENAI_ANSWER)


def session_facts(reader: Reader, session_id: str) -> Row | None:
    """A session's row for its root span: ids, transport, model, times (µs), status, error."""
    rows = reader.rows(
        "SELECT session_id, source, transport, model, client_version, conversation_id, label, status, error, "
        "http_status, host, epoch_us(started_at) AS start_us, epoch_us(ended_at) AS end_us, "
        "(SELECT max(epoch_us(ts)) FROM frames f WHERE f.session_id = s.session_id) AS last_us "
        "FROM sessions s WHERE session_id = ?", [session_id])
    return rows[0] if rows else None


def model_turns(reader: Reader, session_id: str) -> list[Row]:
    """One row per model turn: ``turn`` (its number), ``first_seq``/``start_us`` (the client input
    that started it), ``first_chunk_us`` (the first output after it), ``end_seq``/``end_us`` (its
    last server frame that is no heartbeat), ``chunks``, ``finish`` (the kind that ended it:
    a tool call, ``turn_ended``, an end of stream)."""
    exec_results = "starts_with(kind, 'exec_client_message.')"
    return reader.rows(
        "WITH f AS (SELECT seq, epoch_us(ts) AS ts, direction, kind, ref_id, "
        f"  (direction = 'client' AND (kind IN {kinds.sql_list(_PROMPT_KINDS)} OR ({exec_results} "
        "    AND row_number() OVER (PARTITION BY ref_id, " + exec_results + " ORDER BY seq) = 1))) AS input "
        "  FROM frames WHERE session_id = ?), "
        "t AS (SELECT *, sum(input::INT) OVER (ORDER BY seq) AS turn FROM f) "
        "SELECT turn, min(seq) AS first_seq, min(ts) AS start_us, "
        f"  min(ts) FILTER (WHERE direction = 'server' AND kind IN {kinds.sql_list(_CHUNK_KINDS)}) AS first_chunk_us, "
        f"  count(*) FILTER (WHERE kind IN {kinds.sql_list(_CHUNK_KINDS)}) AS chunks, "
        f"  max(seq) FILTER (WHERE direction = 'server' AND kind NOT IN {kinds.sql_list(kinds.HEARTBEATS)}) AS end_seq, "
        f"  max(ts) FILTER (WHERE direction = 'server' AND kind NOT IN {kinds.sql_list(kinds.HEARTBEATS)}) AS end_us, "
        f"  arg_max(kind, seq) FILTER (WHERE direction = 'server' AND kind NOT IN {kinds.sql_list(kinds.HEARTBEATS)}) "
        "    AS finish "
        "FROM t WHERE turn > 0 GROUP BY turn ORDER BY turn", [session_id])


def execs(reader: Reader, session_id: str) -> list[Row]:
    """Each exec the server asked for: ``exec_id``, ``kind``, ``seq``/``start_us`` of the request,
    ``result_seq``/``end_us`` of the client's first answer (NULL when none came)."""
    return reader.rows(
        "WITH req AS (SELECT ref_id, arg_min(kind, seq) AS kind, min(seq) AS seq, min(epoch_us(ts)) AS start_us "
        "  FROM frames WHERE session_id = ? AND starts_with(kind, 'exec_server_message.') AND ref_id IS NOT NULL "
        "  GROUP BY ref_id), "
        "res AS (SELECT ref_id, min(seq) AS result_seq, min(epoch_us(ts)) AS end_us FROM frames "
        "  WHERE session_id = ? AND direction = 'client' AND (starts_with(kind, 'exec_client_message.') "
        f"  OR kind IN {kinds.sql_list((kinds.EXEC_THROW, kinds.EXEC_STREAM_CLOSE))}) AND ref_id IS NOT NULL "
        "  GROUP BY ref_id) "
        "SELECT req.ref_id AS exec_id, req.kind, req.seq, req.start_us, res.result_seq, res.end_us "
        "FROM req LEFT JOIN res ON res.ref_id = req.ref_id AND res.result_seq > req.seq ORDER BY req.seq",
        [session_id, session_id])


def tool_calls(reader: Reader, session_id: str, *, content: bool) -> list[Row]:
    """The session's tool calls with their times (µs) and seqs; ``args``/``result`` (JSON text) only
    with ``content``."""
    extra = ", CAST(args_merged AS VARCHAR) AS args, CAST(result AS VARCHAR) AS result" if content else ""
    return reader.rows(
        "SELECT call_id, tool_name, exec_id, status, first_seq, last_seq, exec_seq, result_seq, "
        f"epoch_us(started_at) AS start_us, epoch_us(ended_at) AS end_us{extra} FROM tool_calls "
        "WHERE session_id = ? ORDER BY first_seq NULLS LAST, call_id", [session_id])


def openai_facts(reader: Reader, session_id: str) -> Row:
    """The OpenAI side of one request: first answer chunk (µs), finish reasons, token usage as the
    frames' JSON carries it (chat ``usage`` and Responses ``response.usage``)."""
    # the payload as text, and any value of it, read with try(): a payload that is no UTF-8 or no
    # JSON (a hostile or cut body) gives NULL, not an error
    text = "try(decode(payload))"

    def field(path: str) -> str:
        return f"try(json_extract_string({text}, '{path}'))"

    def count(path: str) -> str:
        return f"TRY_CAST({field(path)} AS BIGINT)"

    rows = reader.rows(
        "SELECT "
        f"  min(epoch_us(ts)) FILTER (WHERE kind IN {kinds.sql_list(kinds.OPENAI_ANSWER)}) AS first_chunk_us, "
        f"  list(DISTINCT coalesce({field('$.choices[0].finish_reason')}, {field('$.response.status')})) "
        f"    FILTER (WHERE kind = '{kinds.OPENAI_FINISH}') AS finish, "
        f"  max(coalesce({count('$.usage.prompt_tokens')}, {count('$.response.usage.input_tokens')})) AS input_tokens, "
        f"  max(coalesce({count('$.usage.completion_tokens')}, {count('$.response.usage.output_tokens')})) "
        "    AS output_tokens "
        "FROM frames WHERE session_id = ? AND starts_with(kind, 'openai.') AND kind <> 'openai.request'",
        [session_id])
    return rows[0]


def openai_request_body(reader: Reader, session_id: str) -> str | None:
    """The OpenAI request body (JSON text) of a bridge request session, for ``stream`` and, with
    ``--content``, the messages."""
    rows = reader.rows("SELECT try(decode(payload)) AS body FROM frames WHERE session_id = ? AND kind = ? "
                       "ORDER BY seq LIMIT 1", [session_id, kinds.OPENAI_REQUEST])
    return rows[0]["body"] if rows else None


def run_request_payload(reader: Reader, session_id: str) -> tuple[str, bytes] | None:
    """The first prompt a run carries (kind and payload), for ``--content``."""
    rows = reader.rows("SELECT kind, payload FROM frames WHERE session_id = ? AND direction = 'client' "
                       f"AND kind IN {kinds.sql_list(_PROMPT_KINDS)} ORDER BY seq LIMIT 1", [session_id])
    return (rows[0]["kind"], rows[0]["payload"]) if rows else None


def seq_times(reader: Reader, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
    """seq → epoch µs of those frames (for finding events)."""
    if not seqs:
        return {}
    rows = reader.rows("SELECT seq, epoch_us(ts) AS us FROM frames WHERE session_id = ? AND seq IN (SELECT unnest(?))",
                       [session_id, list(seqs)])
    return {int(r["seq"]): int(r["us"]) for r in rows}


def sessions_since(reader: Reader, since_us: int | None) -> list[str]:
    """Sessions that are not open (a trace is exported whole), started at or after ``since_us``."""
    cond, params = ("", []) if since_us is None else (" AND epoch_us(started_at) >= ?", [since_us])
    return [str(r["session_id"]) for r in reader.rows(
        f"SELECT session_id FROM sessions WHERE coalesce(status, '') <> 'open'{cond} ORDER BY started_at, session_id",
        params)]


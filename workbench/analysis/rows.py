"""The rows the analysis derives besides findings: KV blob requests and tool calls.

Typed dicts rather than classes: they are written as they stand into the ``blobs`` and
``tool_calls`` tables (``engine.write_results``) and printed as they stand by ``workbench blobs
--json`` / ``tools --json``, and the keys are the column names. A tool call carries, besides its
columns, what the rules read (``CallRecord``: the keys starting with ``_``, never stored).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NotRequired, TypedDict


class SessionRecord(TypedDict, total=False):
    """The ``sessions`` row the rules read (``engine.session_row``; empty for an unknown session)."""

    status: str | None
    error: str | None
    conversation_id: str | None
    source: str | None
    transport: str | None
    path: str | None
    http_status: int | None
    meta: dict[str, object]     # parsed from its JSON; {} when absent or not an object
    started_us: int | None      # started_at / ended_at as epoch µs
    ended_us: int | None


class BlobPart(TypedDict):
    """One part of a blob's content: ``text`` / ``thinking`` (text), ``tool-call`` (name, id, args,
    result), ``tool-result`` (name, id, result), anything else (value: its JSON, clipped)."""

    type: str
    text: NotRequired[str]
    name: NotRequired[str | None]
    id: NotRequired[str | None]
    args: NotRequired[Any]      # the call's arguments as JSON values
    result: NotRequired[Any]
    value: NotRequired[str]


class BlobContent(TypedDict):
    """What a blob's bytes hold (``blobs.describe``); all None when the bytes were not seen."""

    content_type: str | None
    role: str | None
    proto_type: str | None
    parts: list[BlobPart] | None
    preview: str | None


class BlobRow(TypedDict):
    """A ``blobs`` row: one KV request (or ``op='ref'``: an id a checkpoint names, never set)."""

    session_id: str
    blob_id: str
    op: str
    seq: int
    result_seq: int | None
    kv_id: int | None
    size: int | None
    content_type: str | None
    role: str | None
    proto_type: str | None
    parts: list[BlobPart] | None
    sha256_ok: bool | None
    checkpoint_ref: str | None
    status: str
    preview: str | None
    data: bytes | None


class ToolCallRow(TypedDict):
    """A ``tool_calls`` row; args and result are JSON values (text when they never parsed)."""

    session_id: str
    call_id: str
    tool_name: str | None
    exec_id: int | None
    model_call_id: str | None
    first_seq: int
    last_seq: int
    exec_seq: int | None
    result_seq: int | None
    args_streamed: Any
    args_completion: Any
    args_merged: Any
    args_naive: str | None
    result: Any
    status: str
    started_at: datetime | str | None  # str: DuckDB's text of a time past year 9999 (db.us_to_time)
    ended_at: datetime | str | None


class CallRecord(ToolCallRow):
    """A tool call as the rules read it: its row plus the frames behind it (``_`` keys, not stored)."""

    _delta_seqs: list[int]
    _deltas: list[str]
    _started_seq: int | None
    _completed_seq: int | None
    _close_seq: int | None
    _exec_args: Any             # the exec request's args tree (None: no exec)
    _case: str | None
    _echo: list[bytes]

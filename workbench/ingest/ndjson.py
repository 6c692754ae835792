"""``cursor-agent --output-format stream-json`` (docs/protocol.md §8): events → ``cli_ndjson`` frames.

Each line is one frame: kind ``type.subtype`` (or ``type``), payload = the line's bytes exactly,
``decoded`` = the event plus derived keys: ``$line``, ``$tool`` (``{name, args, result, error}``
from the nested ``<camelName>ToolCall`` or ``{"function": …}`` shape) and ``$assistant_form``
(``delta`` | ``snapshot`` | ``full``). Lines that are not JSON objects become ``malformed``
frames naming their line number; nothing is dropped.

What the events mean (kinds, assistant forms, tool calls, results, the assistant text a correct
consumer shows) is ``workbench.protocol.stream_json``; this module imports: frames, sessions,
resuming a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.decode.classify import Frame
from workbench.decode.summary import quote
from workbench.ingest import ImportResult
from workbench.ingest.lineage import FileLines, Lineage, choose_lineage
from workbench.jsontypes import JsonObject
from workbench.nesting import load_json
from workbench.protocol.labels import fill_label
from workbench.protocol.stream_json import (
    assistant_form,
    call_id_of,
    event_kind,
    message_text,
    result_outcome,
    text_field,
    timestamp_us,
    tool_info,
)
from workbench.store.db import SessionInfo, now_us
from workbench.store.recorder import Recorder

TRANSPORT = "cli_ndjson"
DIRECTION = "server"  # events come out of the CLI, i.e. towards whoever consumes them
STREAM = "stdout"
_SUMMARY_MAX = 200


# one event's summary -------------------------------------------------------------------------

def _compact(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize(kind: str, ev: JsonObject, tool: JsonObject | None) -> str:
    if kind == "assistant":
        return f"{quote(message_text(ev), 120)} [{assistant_form(ev)}]"
    if kind == "user":
        return quote(message_text(ev), 120)
    if kind == "system.init":
        bits = [f"{k}={ev[k]}" for k in ("model", "cwd", "permissionMode", "apiKeySource") if ev.get(k)]
        return "system.init " + " ".join(bits)
    if kind.startswith("thinking."):
        return quote(str(ev.get("text") or ""), 120) if ev.get("text") else kind
    if kind.startswith("tool_call."):
        cid = repr(ev.get("call_id"))
        name = (tool or {}).get("name") or "?"
        out = f"{kind} {cid} {name}"
        if kind == "tool_call.started":
            return f"{out} {_compact((tool or {}).get('args'))}"
        if tool and tool.get("error") is not None:
            return f"{out} error {_compact(tool['error'], 100)}"
        res = (tool or {}).get("result")
        if isinstance(res, dict) and "exitCode" in res:
            return f"{out} success exit {res['exitCode']}"
        return f"{out} success" if res is not None else out
    if kind == "connection.reconnecting":
        return f"reconnecting attempt {ev.get('attempt')} {ev.get('endpoint_url') or ''}".rstrip()
    if kind == "retry.starting":
        return f"retry attempt {ev.get('attempt')} resume={ev.get('is_resume')}"
    if kind.startswith("result."):
        usage = ev.get("usage") if isinstance(ev.get("usage"), dict) else {}
        bits = [kind]
        if ev.get("duration_ms") is not None:
            bits.append(f"{ev['duration_ms']} ms")
        if usage:
            bits.append(f"in={usage.get('inputTokens')} out={usage.get('outputTokens')}")
        err = ev.get("error")
        if isinstance(err, dict) and err.get("message"):
            bits.append(quote(str(err["message"]), 80))
        elif isinstance(ev.get("result"), str):
            bits.append(quote(ev["result"], 80))
        return " ".join(bits)
    return kind


# one line --------------------------------------------------------------------------------------

@dataclass
class ParsedLine:
    frame: Frame
    decoded: str | None
    session_id: str | None
    ts_us: int | None  # from timestamp_ms
    event: JsonObject | None


def parse_line(raw: bytes, lineno: int) -> ParsedLine:
    """One NDJSON line (without its newline) → a frame; never raises."""
    try:
        ev = load_json(raw)
    except ValueError as exc:  # not JSON, not UTF-8, or nested past the limit every reader shares
        preview = raw[:60].decode("utf-8", "replace")
        return ParsedLine(Frame("malformed", f"line {lineno}: not JSON {quote(preview, 60)}", raw,
                                error=f"line {lineno}: not JSON ({exc})"), None, None, None, None)
    if not isinstance(ev, dict):
        return ParsedLine(Frame("malformed", f"line {lineno}: JSON {type(ev).__name__}, not an object", raw,
                                error=f"line {lineno}: expected a JSON object with 'type'"),
                          None, None, None, None)
    kind = event_kind(ev)
    tool = tool_info(ev.get("tool_call")) if kind.startswith("tool_call") else None
    extra: JsonObject = {"$line": lineno}
    if tool is not None:
        extra["$tool"] = tool
    if kind == "assistant":
        extra["$assistant_form"] = assistant_form(ev)
    call_id = call_id_of(ev)
    error = None
    if "type" not in ev:
        error = f"line {lineno}: event has no 'type'"
    summary = summarize(kind, ev, tool)
    if len(summary) > _SUMMARY_MAX:
        summary = summary[: _SUMMARY_MAX - 1] + "…"
    request_id = ev.get("request_id") if isinstance(ev.get("request_id"), str) else None
    frame = Frame(kind, summary, raw, call_id=call_id, error=error, request_id=request_id)
    decoded = json.dumps({**ev, **extra}, ensure_ascii=False)
    return ParsedLine(frame, decoded, text_field(ev, "session_id"), timestamp_us(ev), ev)


# sessions ---------------------------------------------------------------------------------------

@dataclass
class _Pending:
    parsed: ParsedLine
    session_id: str | None
    ts_us: int | None
    lineno: int = 0


class NdjsonRecorder:
    """Feeds stream-json lines into a ``Recorder``, one session per ``session_id``.

    Lines before the first ``session_id`` (or the first timestamp, when timestamps come from
    ``timestamp_ms``) are held back and then given the first one seen, so every frame lands in
    the right session in order.

    With a ``lineage`` (imports, ``workbench.ingest.lineage``) every line is a unit with a
    ``source_key``, and the lines the database already holds for the file are skipped, so importing
    a file again, a grown file, or re-running a killed import adds only the lines not stored yet.
    """

    def __init__(self, recorder: Recorder, source: str, meta: JsonObject, *,
                 fallback_session: Callable[[], str], fallback_ts: Callable[[], int],
                 live_clock: bool = False, lineage: Lineage | None = None) -> None:
        self.rec = recorder
        self.source = source
        self.meta = meta
        self.fallback_session = fallback_session
        self.fallback_ts = fallback_ts
        self.live_clock = live_clock
        self.session_ids: list[str] = []
        self.created: list[str] = []  # sessions this recorder created (what a failed import removes)
        self.frames = 0
        self.malformed = 0
        self._pending: list[_Pending] = []
        self._sid: str | None = None
        self._last_ts: int | None = None
        self._results: set[str] = set()
        self.lineage = lineage
        self.skipped_lines = 0
        self.skipped_sessions: set[str] = set()  # sessions with stored lines and nothing new

    def feed(self, raw: bytes, lineno: int, arrival_us: int | None = None) -> ParsedLine | None:
        if raw.endswith(b"\r"):
            stripped = raw[:-1]
        else:
            stripped = raw
        if not stripped.strip():
            return None  # blank separator lines carry nothing
        parsed = parse_line(raw, lineno)
        if parsed.session_id:
            self._sid = parsed.session_id
        ts: int | None
        if self.live_clock:
            ts = arrival_us if arrival_us is not None else now_us()
        else:
            ts = parsed.ts_us if parsed.ts_us is not None else self._last_ts
            if parsed.ts_us is not None:
                for p in self._pending:
                    if p.ts_us is None:
                        p.ts_us = parsed.ts_us
        if ts is not None:
            self._last_ts = ts
        self._pending.append(_Pending(parsed, parsed.session_id or self._sid, ts, lineno))
        self._release()
        return parsed

    def _release(self, final: bool = False) -> None:
        while self._pending:
            p = self._pending[0]
            sid = p.session_id or self._sid
            if sid is None or p.ts_us is None:
                if not final:
                    return
                sid = sid or self._sid or self.fallback_session()
                self._sid = sid
                p.ts_us = p.ts_us if p.ts_us is not None else self._last_ts or self.fallback_ts()
            self._pending.pop(0)
            self._write(sid, p.ts_us, p.parsed, p.lineno)

    def _session(self, sid: str) -> SessionInfo:
        info = self.rec.sessions.get(sid)
        if info is not None:
            return info
        fresh = SessionInfo(sid, source=self.source, transport=TRANSPORT, status="open", meta=dict(self.meta))
        info = self.rec.open_session(fresh)
        if info is fresh:
            self.created.append(sid)
        elif self.lineage is not None and self.lineage.continues:
            # An earlier (interrupted, or shorter) import of this file: it continues where that one
            # stopped, status included (a result line it stored is not seen again).
            info.meta["file_sha256"] = self.meta.get("file_sha256")
            self.session_ids.append(sid)
            return info
        else:
            # the database already has this session (a resumed chat): keep its identity, note the source
            info.meta.setdefault("also_from", []).append(
                {k: self.meta[k] for k in ("file", "file_sha256", "command") if k in self.meta})
        self.session_ids.append(sid)
        info.status = "open"
        return info

    def _write(self, sid: str, ts: int, parsed: ParsedLine, lineno: int) -> None:
        key = None
        if self.lineage is not None:
            key = self.lineage.key(lineno, parsed.frame.payload)
            if lineno in self.lineage.stored:
                self.skipped_lines += 1
                if sid not in self.rec.sessions:
                    self.skipped_sessions.add(sid)
                if parsed.frame.kind.startswith("result."):
                    self._results.add(sid)
                return
        self.skipped_sessions.discard(sid)
        info = self._session(sid)
        self.rec.add(sid, ts, DIRECTION, TRANSPORT, STREAM, parsed.frame, parsed.decoded, key)
        self.frames += 1
        if parsed.frame.kind == "malformed":
            self.malformed += 1
        ev = parsed.event or {}
        kind = parsed.frame.kind
        if kind == "user":
            fill_label(info, prompt=message_text(ev))
        elif kind == "system.init":
            if isinstance(ev.get("model"), str):
                info.model = ev["model"]
            for k in ("cwd", "apiKeySource", "permissionMode"):
                if k in ev:
                    info.meta[k] = ev[k]
            if isinstance(ev.get("tools"), list):
                info.meta["tools"] = len(ev["tools"])
        elif kind.startswith("result."):
            self._results.add(sid)
            # a success also clears e.g. "stream ended without a result event" of a shorter import
            info.status, info.error = result_outcome(kind, ev)
            if isinstance(ev.get("request_id"), str):
                info.request_id = ev["request_id"]
            for k in ("usage", "duration_ms", "duration_api_ms"):
                if k in ev:
                    info.meta[k] = ev[k]
        self.rec.touch(sid)

    def finish(self, ended: str | None = None) -> None:
        """Write held-back lines and settle the status of sessions that never got a result."""
        self._release(final=True)
        for sid in self.session_ids:
            if sid in self._results:
                continue
            info = self.rec.sessions[sid]
            info.status = "incomplete"
            info.error = ended or "stream ended without a result event"
            self.rec.touch(sid)


# file import -------------------------------------------------------------------------------------

def detect(path: Path, head: bytes) -> bool:
    for line in head.splitlines():
        if not line.strip():
            continue
        try:
            ev = load_json(line)
        except ValueError:  # not JSON, or nested past the limit: not an NDJSON event line
            return False
        return isinstance(ev, dict) and "type" in ev and "log" not in ev
    return False


def run_import(ctx: Any) -> Any:
    path: Path = ctx.path
    size = path.stat().st_size
    ctx.progress.total = size
    ctx.progress.unit = "lines"
    rec = Recorder(ctx.store)
    mtime_us = int(os.path.getmtime(path) * 1_000_000)
    meta = {"file": str(path), "file_sha256": ctx.file_sha256, "format": "stream-json",
            "timing": "timestamp_ms where the CLI sent it, else the previous event's"}
    lineage = choose_lineage(ctx.store, FileLines.read(path))
    meta["lineage"] = lineage.id
    # Lines without a session_id need a session name that a grown copy of the file gets again.
    sink = NdjsonRecorder(rec, "import:ndjson", meta, fallback_session=lambda: f"ndjson-{lineage.id}",
                          fallback_ts=lambda: mtime_us, lineage=lineage)
    done = 0

    def commit() -> None:
        # frames and their sessions' rows together: an interrupted import leaves whole batches,
        # and running it again continues after the last line stored
        with ctx.store.transaction():
            rec.flush()

    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                done += len(line)
                sink.feed(line[:-1] if line.endswith(b"\n") else line, lineno)
                if len(rec.batch) >= 5000:
                    commit()
                ctx.progress.update(done, lineno)
        sink.finish()
        commit()
    finally:
        ctx.progress.finish()
    result = ImportResult(str(path), "ndjson", sessions=len(sink.session_ids), frames=sink.frames,
                          session_ids=list(sink.session_ids), skipped_sessions=len(sink.skipped_sessions),
                          skipped_frames=sink.skipped_lines)
    if sink.skipped_lines and sink.frames:
        result.notes.append(f"resumed: {sink.skipped_lines} line{'s' if sink.skipped_lines != 1 else ''} "
                            f"already imported, skipped")
    if sink.malformed:
        result.notes.append(f"{sink.malformed} malformed line{'s' if sink.malformed != 1 else ''}")
        ctx.warn(f"{path}: {sink.malformed} line(s) are not JSON events; stored as 'malformed' frames")
    return result

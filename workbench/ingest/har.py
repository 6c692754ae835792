"""HAR files (``log.entries``; ``.zhar`` = zlib-compressed, as mitmproxy writes it).

HAR keeps bodies as text. Binary bodies are fine when base64-encoded (``encoding: "base64"``);
as plain text they survive only if the exporter used a reversible decoding (mitmproxy: latin-1
for bodies without a charset, surrogate-escaped UTF-8 otherwise). Browsers replace undecodable
bytes with U+FFFD: such a body is reported as mangled and stored as one ``malformed`` frame with
the text we got. A candidate decoding is accepted when its length matches the recorded body
size or its Connect framing parses.

An entry is identified by a hash of what it records (start time, request line, headers and body,
response status and body): unit ``har:<hash>``, session ``har-<hash>``. So the same entry in a
later, longer export of the same traffic is recognised, and an entry the file holds twice is
imported once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workbench.decode.classify import Decoder
from workbench.ingest import ImportResult, IngestError
from workbench.ingest.exchange import Exchange
from workbench.ingest.exchange_import import write_exchanges
from workbench.jsontypes import JsonObject
from workbench.protocol.status import STREAM_TRANSPORTS, http_ok
from workbench.wire.inflate import InflateOverBudget, inflate_document


def detect(path: Path, head: bytes) -> bool:
    if head[:1] == b"\x78":  # zlib stream: mitmproxy's .zhar
        try:
            head = zlib.decompressobj().decompress(head, 4096)
        except zlib.error:
            return False
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text.startswith(b"{"):
        return False
    first = text.split(b"\n", 1)[0]
    try:
        doc = json.loads(first)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None  # pretty-printed JSON: the first line is not a whole document
    if isinstance(doc, dict):
        return "log" in doc  # one-line JSON: a HAR or an NDJSON event, decided by its keys
    # Cheap check on the start of the document; full validation happens in run_import.
    return b'"log"' in text[:4096] or b'"entries"' in text[:65536]


def load(path: Path) -> JsonObject:
    data = path.read_bytes()
    if data[:1] == b"\x78":
        # The whole document is inflated before anything is parsed: it is charged to the import's
        # budgets as a session of its own (no per-frame limit), never inflated unbounded.
        try:
            data = inflate_document(data, "zlib", what="the .zhar document",
                                    corrupt="looks zlib-compressed (.zhar) but does not inflate")
        except InflateOverBudget as exc:
            raise IngestError(f"{path}: {exc}; nothing imported from it") from None
        except ValueError as exc:
            raise IngestError(f"{path}: {exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"{path}: HAR is not UTF-8 text ({exc})") from None
    del data  # the bytes and their text are not both needed while the JSON is parsed
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IngestError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise IngestError(f"{path}: JSON nested too deeply to be a HAR file") from None
    entries = doc.get("log", {}).get("entries") if isinstance(doc, dict) and isinstance(doc.get("log"), dict) else None
    if not isinstance(entries, list):
        raise IngestError(f"{path}: JSON without log.entries — not a HAR file")
    return doc


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):  # not a time, or one no datetime holds once in UTC
        return None


def _ms(timings: JsonObject, key: str) -> float:
    v = timings.get(key)
    return float(v) / 1000 if isinstance(v, int | float) and v > 0 else 0.0


def _headers(items: Any) -> list[tuple[str, str]]:
    out = []
    for h in items or []:
        if isinstance(h, dict) and "name" in h:
            out.append((str(h["name"]), str(h.get("value", ""))))
    return out


def _framing_ok(dec: Decoder, data: bytes, transport: str, direction: str) -> bool:
    frames = dec.decode_body(data, transport, direction)
    return all(f.kind != "malformed" for f in frames)


def text_body(dec: Decoder, text: str, encoding: str | None, size: int | None, transport: str,
              direction: str) -> tuple[bytes, str | None]:
    """HAR body text → bytes, and a problem description when the bytes cannot be trusted."""
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=False), None
        except (binascii.Error, ValueError) as exc:
            return text.encode("utf-8", "surrogatepass"), f"is not valid base64 ({exc})"
    candidates: list[bytes] = []
    if all(ord(c) < 256 for c in text):
        candidates.append(text.encode("latin-1"))
    candidates.append(text.encode("utf-8", "surrogateescape") if not any(0xD800 <= ord(c) < 0xDC80 for c in text)
                      else text.encode("utf-8", "surrogatepass"))
    if size and size > 0:
        for c in candidates:
            if len(c) == size:
                return c, None
    for c in candidates:
        if _framing_ok(dec, c, transport, direction):
            return c, None
    if "\ufffd" in text or (size and size > 0):
        return candidates[-1], ("mangled in HAR text form (a binary Connect body saved as text, not base64"
                                + (": U+FFFD replacement characters" if "\ufffd" in text else
                                   f": {len(candidates[-1])} bytes, the entry says {size}") + ")")
    return candidates[-1], None


def entry_hash(entry: JsonObject) -> str:
    """16 hex digits identifying what an entry records (exporter-specific extras left out)."""
    def obj(d: JsonObject, key: str) -> JsonObject:
        v = d.get(key)
        return v if isinstance(v, dict) else {}

    req, resp = obj(entry, "request"), obj(entry, "response")
    post, content = obj(req, "postData"), obj(resp, "content")
    what = [entry.get("startedDateTime"), req.get("method"), req.get("url"), req.get("headers"),
            post.get("text"), resp.get("status"), resp.get("headers"), content.get("text")]
    blob = json.dumps(what, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    return hashlib.sha256(blob).hexdigest()[:16]


def to_exchange(dec: Decoder, entry: Any, n: int) -> Exchange:
    where = f"entry {n}"
    if not isinstance(entry, dict) or not isinstance(entry.get("request"), dict):
        raise IngestError(f"{where}: no request object")
    req = entry["request"]
    resp: JsonObject = entry["response"] if isinstance(entry.get("response"), dict) else {}
    url = req.get("url")
    if not isinstance(url, str) or not url:
        raise IngestError(f"{where}: request has no url")

    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    h = entry_hash(entry)
    ex = Exchange(ident=where, stream_key=where, session_key=f"har-{h}", unit=f"har:{h}",
                  method=str(req.get("method") or "GET"), host=parts.hostname or "", path=path or "/",
                  http_version=str(req.get("httpVersion") or ""), req_headers=_headers(req.get("headers")),
                  resp_headers=_headers(resp.get("headers")), meta={"har_entry": n})
    route = ex.route
    transport = route.transport if route is not None else "unary"
    post = req.get("postData") if isinstance(req.get("postData"), dict) else None
    if post is not None and isinstance(post.get("text"), str):
        size = req.get("bodySize") if isinstance(req.get("bodySize"), int) else None
        ex.req_body, problem = text_body(dec, post["text"], post.get("encoding"), size, transport, "client")
        ex.req_missing = problem
    elif isinstance(req.get("bodySize"), int) and req["bodySize"] > 0:
        ex.req_body, ex.req_missing = None, f"not recorded in the HAR (bodySize {req['bodySize']})"
    else:
        ex.req_body = b""
    status = resp.get("status")
    ex.status = status if isinstance(status, int) and status > 0 else None
    content: JsonObject = resp["content"] if isinstance(resp.get("content"), dict) else {}
    text = content.get("text")
    if ex.status is None:
        ex.resp_body = None
    elif isinstance(text, str) and text:
        size = content.get("size") if isinstance(content.get("size"), int) else None
        if any(k.lower() == "content-encoding" for k, _ in ex.resp_headers):
            size = None  # HAR sizes count the encoded body; the text is the decoded one
        ex.resp_body, ex.resp_missing = text_body(dec, text, content.get("encoding"), size, transport, "server")
    elif route is not None and transport in STREAM_TRANSPORTS and http_ok(ex.status):
        # A stream always ends with an end-stream frame; an empty 2xx body was not recorded.
        ex.resp_body, ex.resp_missing = None, "streamed"
        ex.meta["har_empty_body"] = True
    else:
        ex.resp_body = b""
    err = resp.get("_error")
    if isinstance(err, str) and err:
        ex.error = err
    start = _epoch(entry.get("startedDateTime"))
    timings: JsonObject = entry["timings"] if isinstance(entry.get("timings"), dict) else {}
    if start is not None:
        pre = _ms(timings, "blocked") + _ms(timings, "dns") + _ms(timings, "connect")
        ex.t_req_start = start
        ex.t_req_end = start + pre + _ms(timings, "send")
        ex.t_resp_start = ex.t_req_end + _ms(timings, "wait")
        ex.t_resp_end = ex.t_resp_start + _ms(timings, "receive")
        total = entry.get("time")
        if not timings and isinstance(total, int | float) and total > 0:
            ex.t_resp_end = start + total / 1000
        if timings.get("receive") == 0 and transport in STREAM_TRANSPORTS and ex.resp_body:
            # mitmproxy's exporter writes receive 0 when the response never finished (the flow ended
            # in an error, e.g. the client left a stalled stream): a stream's body does not arrive in
            # no time, so its end is unknown, as in the flow file (no timestamp_end).
            ex.t_resp_end = None
    return ex


def run_import(ctx: Any) -> Any:
    path: Path = ctx.path
    doc = load(path)
    entries = doc["log"]["entries"]
    ctx.progress.total = len(entries)
    ctx.progress.unit = "entries"
    exchanges: dict[str, Exchange] = {}
    repeats = 0
    try:
        for n, entry in enumerate(entries, 1):
            try:
                ex = to_exchange(ctx.decoder, entry, n)
            except IngestError as exc:
                raise IngestError(f"{path}: {exc}; nothing imported from it") from exc
            if ex.unit in exchanges:
                repeats += 1
                continue
            exchanges[ex.unit] = ex
            ctx.progress.update(n)
    finally:
        ctx.progress.finish()
    file_meta = {"file": str(path), "file_sha256": ctx.file_sha256, "format": "har"}
    res = write_exchanges(ctx.store, ctx.decoder, list(exchanges.values()), source="import:har",
                          file_meta=file_meta, warn=ctx.warn, progress=ctx.progress)
    result = ImportResult(str(path), "har", sessions=len(res.session_ids), frames=res.frames,
                          session_ids=res.session_ids)
    if repeats:
        result.notes.append(f"{repeats} repeated {'entry' if repeats == 1 else 'entries'} imported once")
    result.notes.extend(res.notes(0, "entry", "entries"))
    result.skipped_sessions = len(res.result.skipped)
    result.skipped_frames = res.result.skipped_frames
    return result

"""mitmproxy flow files (``mitmdump -w``): tnetstring-serialized flows read with ``FlowReader``.

A flow whose body mitmproxy streamed has no body in the file (``raw_content`` is ``None``): its
session is recorded as ``incomplete`` with ``body not recorded (streamed)`` and reported.
The whole file is read before anything is written, so a truncated or corrupt file imports
nothing and the error names the flow where reading stopped. A flow is identified by its id
(unit ``flow:<id>``): a flow the file holds twice is imported once (its last copy, the most
complete state mitmproxy saved).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.ingest import ImportResult, IngestError
from workbench.ingest.exchange import Exchange
from workbench.ingest.exchange_import import write_exchanges
from workbench.protocol.status import RESET_METADATA_KEY
from workbench.wire.inflate import codings_of

_TNETSTRING = re.compile(rb"^\d{1,12}:")


def detect(path: Path, head: bytes) -> bool:
    return bool(_TNETSTRING.match(head))


def _body(msg: Any) -> tuple[bytes | None, str | None, list[str]]:
    """The body as recorded, why it is missing, and the content-codings still applied to it.

    HTTP content-encoding is undone later, within the inflate budgets (``decode_exchange``), never
    here: mitmproxy's ``get_content`` inflates without a limit (a 42 KB flow file grew past 5.9 GB).
    Connect's own per-envelope gzip stays for the decoder.
    """
    if msg is None:
        return None, None, []
    if msg.raw_content is None:
        return None, "streamed", []
    return msg.raw_content, None, codings_of(msg.headers.get("content-encoding"))


def _text(value: Any) -> str:
    """Header values and paths as str: bytes that are not UTF-8 stay surrogate-escaped, as mitmproxy
    gives them (the store's escape keeps them recoverable), never an exception here."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _pairs(fields: Any) -> list[tuple[str, str]]:
    return [(_text(k), _text(v)) for k, v in fields.items(multi=True)]


def to_exchange(flow: Any, n: int) -> Exchange:
    req, resp = flow.request, flow.response
    req_body, req_missing, req_coding = _body(req)
    resp_body, resp_missing, resp_coding = _body(resp)
    ex = Exchange(
        ident=f"flow {n} (id {flow.id})", stream_key=flow.id, session_key=flow.id, unit=f"flow:{flow.id}",
        method=_text(req.method), host=_text(req.pretty_host), path=_text(req.path),
        http_version=_text(req.http_version), req_headers=_pairs(req.headers),
        req_body=req_body, req_missing=req_missing, req_coding=req_coding,
        status=resp.status_code if resp is not None else None,
        resp_headers=_pairs(resp.headers) if resp is not None else [],
        resp_body=resp_body if resp is not None else None, resp_missing=resp_missing, resp_coding=resp_coding,
        trailers=_pairs(resp.trailers) if resp is not None and resp.trailers else [],
        t_req_start=req.timestamp_start, t_req_end=req.timestamp_end,
        t_resp_start=resp.timestamp_start if resp is not None else None,
        t_resp_end=resp.timestamp_end if resp is not None else None,
        error=_text(flow.error.msg) if flow.error is not None else None,
        reset=_reset(flow),
        meta={"flow_id": flow.id},
    )
    return ex


def _reset(flow: Any) -> dict[str, Any] | None:
    """The reset facts the capture addon noted on the flow (saved with it when the addon was loaded)."""
    info = flow.metadata.get(RESET_METADATA_KEY) if isinstance(flow.metadata, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("side"), str):
        return None
    return {k: v for k, v in info.items() if isinstance(v, str | int | bool) or v is None}


def read_exchanges(path: Path, progress: Any = None) -> tuple[list[Exchange], int, int]:
    """Every HTTP flow of the file as an Exchange (once per flow id), the number of non-HTTP flows
    and the number of repeated copies dropped."""
    # mitmproxy loads only to read a flow file
    from mitmproxy import exceptions, http, io


    out: dict[str, Exchange] = {}
    position: dict[str, int] = {}
    other = 0
    repeats = 0
    n = 0
    with path.open("rb") as fh:
        flows = iter(io.FlowReader(fh).stream())
        while True:
            try:
                flow = next(flows, None)
            except (exceptions.FlowReadException, ValueError, KeyError, TypeError, AttributeError,
                    IndexError, UnicodeDecodeError, OverflowError, RecursionError) as exc:
                # mitmproxy raises more than FlowReadException on corrupt state (a missing key, a
                # wrong type): all of them mean this flow cannot be read
                what = (str(exc) if isinstance(exc, exceptions.FlowReadException) else
                        "nested too deeply" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {exc}")
                raise IngestError(f"{path}: flow {n + 1} (after byte {fh.tell()}) cannot be read: {what} "
                                  f"— truncated, damaged or not a mitmproxy flow file; nothing imported from it"
                                  ) from exc
            if flow is None:
                break
            n += 1
            if isinstance(flow, http.HTTPFlow):
                first = position.setdefault(flow.id, n)
                if first != n:
                    repeats += 1
                try:
                    out[flow.id] = to_exchange(flow, first)  # the last copy, named by its first place
                except (ValueError, TypeError, AttributeError, KeyError) as exc:
                    raise IngestError(f"{path}: flow {n} (id {flow.id}) is damaged: {type(exc).__name__}: {exc}; "
                                      f"nothing imported from it") from exc
            else:
                other += 1
            if progress is not None:
                progress.update(fh.tell(), n)
    return list(out.values()), other, repeats


def run_import(ctx: Any) -> Any:
    path: Path = ctx.path
    ctx.progress.total = path.stat().st_size
    ctx.progress.unit = "flows"
    try:
        exchanges, other, repeats = read_exchanges(path, ctx.progress)
    finally:
        ctx.progress.finish()
    file_meta = {"file": str(path), "file_sha256": ctx.file_sha256, "format": "mitmproxy-flows"}
    res = write_exchanges(ctx.store, ctx.decoder, exchanges, source="import:flow", file_meta=file_meta,
                          warn=ctx.warn, progress=ctx.progress)
    result = ImportResult(str(path), "flow", sessions=len(res.session_ids), frames=res.frames,
                          session_ids=res.session_ids)
    if repeats:
        result.notes.append(f"{repeats} repeated {'copy' if repeats == 1 else 'copies'} of flows imported once")
    result.notes.extend(res.notes(other, "flow", "flows"))
    result.skipped_sessions = len(res.result.skipped)
    result.skipped_frames = res.result.skipped_frames
    return result


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

from workbench.ingest.exchange import Exchange, write_exchanges
from workbench.protocol.status import RESET_METADATA_KEY

_TNETSTRING = re.compile(rb"^\d{1,12}:")


def detect(path: Path, head: bytes) -> bool:
    return bool(_TNETSTRING.match(head))


def _body(msg: Any) -> tuple[bytes | None, str | None]:
    if msg is None:
        return None, None
    if msg.raw_content is None:
        return None, "streamed"
    # Undo HTTP content-encoding (gzip/br); Connect's own per-envelope gzip stays for the decoder.
    return msg.get_content(strict=False) or b"", None


def to_exchange(flow: Any, n: int) -> Exchange:
    req, resp = flow.request, flow.response
    req_body, req_missing = _body(req)
    resp_body, resp_missing = _body(resp)
    ex = Exchange(
        ident=f"flow {n} (id {flow.id})", stream_key=flow.id, session_key=flow.id, unit=f"flow:{flow.id}",
        method=req.method, host=req.pretty_host, path=req.path, http_version=req.http_version,
        req_headers=[(str(k), str(v)) for k, v in req.headers.items(multi=True)],
        req_body=req_body, req_missing=req_missing,
        status=resp.status_code if resp is not None else None,
        resp_headers=[(str(k), str(v)) for k, v in resp.headers.items(multi=True)] if resp is not None else [],
        resp_body=resp_body if resp is not None else None, resp_missing=resp_missing,
        trailers=[(str(k), str(v)) for k, v in resp.trailers.items(multi=True)]
        if resp is not None and resp.trailers else [],
        t_req_start=req.timestamp_start, t_req_end=req.timestamp_end,
        t_resp_start=resp.timestamp_start if resp is not None else None,
        t_resp_end=resp.timestamp_end if resp is not None else None,
        error=flow.error.msg if flow.error is not None else None,
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
    from mitmproxy import exceptions, http, io

    from workbench.ingest import IngestError

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
                    IndexError, UnicodeDecodeError, OverflowError) as exc:
                # mitmproxy raises more than FlowReadException on corrupt state (a missing key, a
                # wrong type): all of them mean this flow cannot be read
                what = str(exc) if isinstance(exc, exceptions.FlowReadException) else f"{type(exc).__name__}: {exc}"
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
    from workbench.ingest import ImportResult

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


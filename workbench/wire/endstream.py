"""Connect end-stream (flag 0x02) JSON and gRPC status trailers (HTTP trailers, gRPC-Web flag 0x80):
parsing what a server sent, and building what a server sends (``end_stream_payload``,
``grpc_trailers``, ``grpc_web_trailer_payload``)."""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.jsontypes import JsonObject

DetailsDecoder = Callable[[bytes], JsonObject]


@dataclass(slots=True)
class EndStream:
    """A parsed end-of-stream message; ``code`` is None for a clean end."""

    code: str | None = None
    message: str | None = None
    details: list[JsonObject] = field(default_factory=list)
    metadata: JsonObject = field(default_factory=dict)
    raw: Any = None

    @property
    def is_error(self) -> bool:
        return self.code is not None

    def as_dict(self) -> JsonObject:
        out: JsonObject = {}
        if self.code is not None:
            out["error"] = {"code": self.code, "message": self.message, "details": self.details}
        if self.metadata:
            out["metadata"] = self.metadata
        return out


def b64decode_loose(text: str) -> bytes:
    """Base64 that may be unpadded and may use the URL-safe alphabet (Connect sends both).

    Anything else outside the alphabet is an error (binascii.Error), never silently skipped.
    """
    s = "".join(text.split()).rstrip("=").replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)


def parse_end_stream(payload: bytes, decode_details: DetailsDecoder | None = None) -> EndStream:
    """Parse an end-stream payload. Raises ValueError when it is not the JSON Connect requires."""
    try:
        doc = json.loads(payload.decode("utf-8")) if payload.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"end-stream payload is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("end-stream payload is not a JSON object")
    es = EndStream(raw=doc, metadata=doc.get("metadata") or {})
    err = doc.get("error")
    if isinstance(err, dict):
        es.code = str(err.get("code") or "unknown")
        msg = err.get("message")
        es.message = urllib.parse.unquote(msg) if isinstance(msg, str) else msg
        es.details = [_detail(d, decode_details) for d in err.get("details") or [] if isinstance(d, dict)]
    return es


def end_stream_payload(error: Mapping[str, Any] | None = None) -> bytes:
    """The JSON of a Connect end-stream: ``{}`` for a clean end, else ``{"error": …}``.

    ``error`` is the error object (``{"code": …, "message": …, "details": […]}``) or the whole
    document (``{"error": …, "metadata": …}``).
    """
    doc: JsonObject = {}
    if error:
        doc = dict(error) if ("error" in error or "metadata" in error) else {"error": dict(error)}
    return json.dumps(doc, separators=(",", ":")).encode()


def _detail(d: JsonObject, decode_details: DetailsDecoder | None) -> JsonObject:
    out: JsonObject = {"type": d.get("type")}
    if "debug" in d:
        out["debug"] = d["debug"]
    value = d.get("value")
    if isinstance(value, str):
        try:
            raw = b64decode_loose(value)
        except (binascii.Error, ValueError) as exc:
            out["value_error"] = f"bad base64: {exc}"
        else:
            out["value_hex"] = raw.hex()
            if decode_details is not None:
                try:
                    out["value"] = decode_details(raw)
                except Exception as exc:  # a detail we cannot decode must not hide the error itself
                    out["value_error"] = str(exc)
    return out


def parse_grpc_web_trailer(payload: bytes) -> dict[str, str]:
    """``grpc-status: N\\r\\ngrpc-message: …`` lines into a dict (names lower-cased)."""
    out: dict[str, str] = {}
    for line in payload.decode("utf-8", "replace").split("\n"):
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip().lower()
            val = value.strip()
            out[key] = urllib.parse.unquote(val) if key == "grpc-message" else val
    return out


# --------------------------------------------------------------------------------------------
# gRPC status (trailers of gRPC over HTTP/2, the 0x80 trailer frame of gRPC-Web)
# --------------------------------------------------------------------------------------------

# Connect error code → gRPC status number (the two protocols share one code table).
GRPC_STATUS: dict[str, int] = {
    "canceled": 1, "unknown": 2, "invalid_argument": 3, "deadline_exceeded": 4, "not_found": 5,
    "already_exists": 6, "permission_denied": 7, "resource_exhausted": 8, "failed_precondition": 9,
    "aborted": 10, "out_of_range": 11, "unimplemented": 12, "internal": 13, "unavailable": 14,
    "data_loss": 15, "unauthenticated": 16,
}
CONNECT_CODE: dict[int, str] = {n: c for c, n in GRPC_STATUS.items()}


def encode_grpc_message(message: str) -> str:
    """``grpc-message`` value: UTF-8, bytes outside printable ASCII and ``%`` percent-encoded."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def grpc_trailers(code: str | None, message: str | None = None,
                  status_details: bytes | None = None) -> list[tuple[str, str]]:
    """The trailer fields ending a gRPC/gRPC-Web response: ``code`` None (or "ok") = status 0.

    ``status_details`` is a serialized google.rpc.Status, sent unpadded-base64 as
    ``grpc-status-details-bin``.
    """
    if code is None or code == "ok":
        return [("grpc-status", "0")]
    out = [("grpc-status", str(GRPC_STATUS.get(code, GRPC_STATUS["unknown"])))]
    if message:
        out.append(("grpc-message", encode_grpc_message(message)))
    if status_details:
        out.append(("grpc-status-details-bin", base64.b64encode(status_details).decode().rstrip("=")))
    return out


def grpc_web_trailer_payload(trailers: list[tuple[str, str]]) -> bytes:
    """The body of a gRPC-Web trailer frame (flag 0x80): ``name: value`` lines, CRLF-terminated."""
    return "".join(f"{k.lower()}: {v}\r\n" for k, v in trailers).encode("ascii")


def end_from_grpc(trailers: dict[str, str], decode_status: DetailsDecoder | None = None) -> EndStream:
    """How a gRPC/gRPC-Web response ended, as an EndStream (Connect code names).

    ``trailers`` as ``parse_grpc_web_trailer`` returns them (grpc-message already unquoted);
    ``decode_status`` turns grpc-status-details-bin bytes into ``{"details": [...]}``.
    """
    raw = trailers.get("grpc-status")
    if raw is None:
        return EndStream(code="internal", message="response ended without grpc-status", raw=trailers)
    try:
        number = int(raw)
    except ValueError:
        return EndStream(code="internal", message=f"grpc-status {raw!r} is not a number", raw=trailers)
    if number == 0:
        return EndStream(raw=trailers)
    es = EndStream(code=CONNECT_CODE.get(number, "unknown"), message=trailers.get("grpc-message"), raw=trailers)
    bin_value = trailers.get("grpc-status-details-bin")
    if bin_value and decode_status is not None:
        try:
            es.details = list(decode_status(b64decode_loose(bin_value)).get("details") or [])
        except Exception as exc:  # bad details must not hide the status itself
            es.details = [{"value_error": f"grpc-status-details-bin: {exc}"}]
    return es

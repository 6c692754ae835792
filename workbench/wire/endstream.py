"""Connect end-stream (flag 0x02) JSON and gRPC-Web trailer (flag 0x80) parsing."""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DetailsDecoder = Callable[[bytes], dict[str, Any]]


@dataclass(slots=True)
class EndStream:
    """A parsed end-of-stream message; ``code`` is None for a clean end."""

    code: str | None = None
    message: str | None = None
    details: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    raw: Any = None

    @property
    def is_error(self) -> bool:
        return self.code is not None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
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


def _detail(d: dict[str, Any], decode_details: DetailsDecoder | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": d.get("type")}
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

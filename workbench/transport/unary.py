"""Unary calls of agent backends: request/response objects, Connect errors, typed handlers.

A ``UnaryHandler`` sees the request message's bytes whatever the caller's framing (the router
strips gRPC/gRPC-Web envelopes first and frames the answer back, see ``workbench.transport.framing``);
``typed_unary`` additionally turns Connect JSON (``application/json``) into the same protobuf
message and answers in JSON, so one handler serves every content type.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

UNARY_CT = "application/proto"

# Connect error code → HTTP status of a unary error.
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429,
    "failed_precondition": 400, "aborted": 409, "out_of_range": 400, "unimplemented": 501,
    "internal": 500, "unavailable": 503, "data_loss": 500, "unauthenticated": 401,
}


@dataclass(slots=True)
class UnaryRequest:
    path: str
    headers: Mapping[str, str]
    body: bytes  # the request message: bare protobuf, or JSON for application/json

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def is_json(self) -> bool:
        return self.content_type == "application/json"


@dataclass(slots=True)
class UnaryResponse:
    status: int = 200
    body: bytes = b""
    content_type: str = UNARY_CT
    headers: dict[str, str] = field(default_factory=dict)


UnaryHandler = Callable[[UnaryRequest], Awaitable[UnaryResponse]]
# Request headers → a Connect error object refusing the call, or None to let it through.
AuthCheck = Callable[[Mapping[str, str]], "dict[str, Any] | None"]


def connect_error(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Connect error object (the value of ``error`` in an end-stream, or a unary error body)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return err


def unary_error(error: Mapping[str, Any]) -> UnaryResponse:
    """A Connect unary error response: non-200 status + JSON body."""
    status = HTTP_STATUS.get(str(error.get("code")), 500)
    return UnaryResponse(status, json.dumps(dict(error)).encode(), "application/json")


def typed_unary(request_type: type[Message],
                fn: Callable[[Any, UnaryRequest], Awaitable[Message | UnaryResponse]]) -> UnaryHandler:
    """A handler taking and returning protobuf messages, in binary or Connect JSON alike.

    ``fn(message, request)`` returns the response message (or a ready ``UnaryResponse``, e.g. an
    error). A request that does not parse is answered ``invalid_argument`` naming the type.
    """
    name = request_type.DESCRIPTOR.full_name

    async def handler(req: UnaryRequest) -> UnaryResponse:
        msg = request_type()
        try:
            if req.is_json:
                json_format.Parse(req.body.decode("utf-8") or "{}", msg, ignore_unknown_fields=True)
            else:
                msg.ParseFromString(req.body)
        except Exception as exc:
            return unary_error(connect_error("invalid_argument", f"{req.path}: body is not a {name}: {exc}"))
        out = await fn(msg, req)
        if isinstance(out, UnaryResponse):
            return out
        if req.is_json:
            return UnaryResponse(body=json_format.MessageToJson(out, indent=None).encode(),
                                 content_type="application/json")
        return UnaryResponse(body=bytes(out.SerializeToString()))

    return handler

"""The HTTP headers of the client's calls, as the real CLI sends them (docs/protocol.md §1): the one
place the bearer token is put on a request."""

from __future__ import annotations

from workbench import __version__

CONNECT_STREAM_CT = "application/connect+proto"
CONNECT_UNARY_CT = "application/proto"
GRPC_WEB_CT = "application/grpc-web+proto"
CLIENT_VERSION = f"workbench-{__version__}"


def connect_headers(token: str, request_id: str, content_type: str, *, http1: bool = False
                    ) -> list[tuple[str, str]]:
    """Headers the real CLI sends (docs/protocol.md §1); the token is only ever put here."""
    hdrs = [
        ("authorization", f"Bearer {token}"),
        ("connect-protocol-version", "1"),
        ("content-type", content_type),
        ("x-request-id", request_id),
        ("x-cursor-client-version", CLIENT_VERSION),
        ("x-cursor-client-type", "cli"),
        ("te", "trailers"),
    ]
    if http1:
        hdrs.append(("x-cursor-streaming", "true"))
    return hdrs


def framed_headers(token: str, request_id: str, framing: str, *, unary: bool, http1: bool = False
                   ) -> list[tuple[str, str]]:
    """``connect_headers`` for a stream or a unary call in ``framing``."""
    if framing == "grpc-web":
        hdrs = [h for h in connect_headers(token, request_id, GRPC_WEB_CT, http1=http1)
                if h[0] != "connect-protocol-version"]
        return [*hdrs, ("x-grpc-web", "1")]
    return connect_headers(token, request_id, CONNECT_UNARY_CT if unary else CONNECT_STREAM_CT, http1=http1)

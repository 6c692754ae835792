"""Which HTTP exchanges are agent traffic, and how each one travels (its transport).

One classification for live capture (``workbench.capture.addon``, with the user's host and path
globs) and imports (``workbench.ingest.exchange``, every agent and aiserver RPC path): a request
path names the RPC, and the RPC decides the transport (Run/RunSSE/RunPoll streams, BidiAppend,
unary calls).

Classification is by path first (docs/protocol.md §1, "Paths, not hosts"): the agent RPC
paths are recorded on any host, so the addon works in front of the simulator or a local proxy. On
Cursor's own hosts every Connect/gRPC RPC path (``/<package>.<Service>/<Method>``) is recorded
too; other paths there (``/auth/...``) are left alone, their bodies being login tokens.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_HOSTS = ("*.cursor.sh", "cursor.sh", "*.cursorapi.com")
# The AiService model listing is what stateless proxies ask (issue 17): recorded wherever it goes.
DEFAULT_PATHS = ("/agent.v1.AgentService/*", "/aiserver.v1.BidiService/*", "/aiserver.v1.ServerConfigService/*",
                 "/aiserver.v1.AiService/GetUsableModels")

_RPC_PATH = re.compile(r"^/([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)/([A-Za-z_]\w*)$")
_STREAMING_TYPES = ("application/connect+", "application/grpc")

# The OpenAI side of a bridge (issue 25): recorded on any host, whatever prefix the base URL has
# (``/v1/chat/completions``, ``/api/v1/chat/completions``). Bodies stream through in both
# directions (an SSE answer must reach the client as it is written); each transport is a session.
OPENAI_ROUTES = (("*/chat/completions", "openai_chat"), ("*/v1/responses", "openai_responses"),
                 ("*/v1/models", "openai_models"), ("*/v1/models/*", "openai_models"))
OPENAI_TRANSPORTS = ("openai_chat", "openai_responses", "openai_models")

AGENT_SERVICE = "agent.v1.AgentService"
BIDI_SERVICE = "aiserver.v1.BidiService"


@dataclass(frozen=True, slots=True)
class Route:
    """How one matched flow is handled."""

    transport: str          # run | runsse | runpoll | bidi_append | unary | openai_chat | openai_responses | openai_models
    streaming: bool         # bodies pass through chunk by chunk (both directions)
    service: str | None
    method: str | None

    @property
    def request_type(self) -> str | None:
        return f"{self.service.rsplit('.', 1)[0]}.{self.method}Request" if self.service and self.method else None

    @property
    def response_type(self) -> str | None:
        return f"{self.service.rsplit('.', 1)[0]}.{self.method}Response" if self.service and self.method else None


def is_openai_transport(transport: str | None) -> bool:
    return bool(transport) and transport in OPENAI_TRANSPORTS


def openai_route(path: str) -> Route | None:
    """The route of an OpenAI-compatible request path, or None."""
    path = path.split("?", 1)[0]
    for pattern, transport in OPENAI_ROUTES:
        if fnmatch.fnmatchcase(path, pattern):
            return Route(transport, True, None, None)
    return None


def split_list(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(s.strip() for s in items if s.strip())


class Matcher:
    def __init__(self, hosts: str | Sequence[str] = DEFAULT_HOSTS, paths: str | Sequence[str] = DEFAULT_PATHS):
        self.hosts = tuple(h.lower() for h in split_list(hosts))
        self.paths = split_list(paths)

    def host_matches(self, host: str) -> bool:
        h = host.lower().rstrip(".")
        return any(fnmatch.fnmatchcase(h, pat) for pat in self.hosts)

    def path_matches(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pat) for pat in self.paths)

    def route(self, host: str, path: str, content_type: str = "") -> Route | None:
        """The route for a request, or None to leave the flow untouched."""
        path = path.split("?", 1)[0]
        openai = openai_route(path)
        if openai is not None:
            return openai
        if not (self.path_matches(path) or (self.host_matches(host) and _RPC_PATH.match(path))):
            return None
        m = _RPC_PATH.match(path)
        service, method = (m.group(1), m.group(2)) if m else (None, None)
        if service == AGENT_SERVICE and method in ("Run", "RunSSE", "RunPoll"):
            return Route(method.lower(), True, service, method)
        if service == BIDI_SERVICE and method == "BidiAppend":
            return Route("bidi_append", False, service, method)
        ctype = content_type.lower()
        streaming = ctype.startswith(_STREAMING_TYPES) or (method or "").endswith(("SSE", "Poll"))
        return Route("unary", streaming, service, method)

"""workbench.transport — the server side of Connect (and gRPC, gRPC-Web) over HTTP/2 and HTTP/1.1.

Used by the simulated backend (``workbench.sim``), the fixture replay server
(``workbench.fixtures.replay``) and the OpenAI-compatible proxy (``workbench.proxy``); it knows
nothing about any of them. Layers, bottom up:

- ``exchange``: one request/response pair (``Exchange``), ``ConnectionClosed``, ``RequestError``;
- ``h2_server`` (``h2``) and ``h1_server`` (``h11``): connections producing exchanges;
- ``server``: the listening socket (TLS + ALPN, h2c sniffing, shutdown), ``listen(app)``;
  ``Endpoint``: ``url``, ``port``, ``cert_path`` for the objects that run a server;
- ``router``: path → handler, Connect methods and plain HTTP handlers alike;
- ``framing`` (Connect / gRPC-Web / gRPC bytes), ``unary`` (unary requests, Connect errors),
  ``bidi_append`` (the BidiAppend write side), ``channel`` (``AgentConnection``: one run over
  Run, RunSSE or RunPoll), ``agent_service`` (the agent backend's routes, ``serve(handler)``);
- ``runner``: a server on a background thread for synchronous callers; ``certs``: the loopback
  certificate.

See docs/sim.md "The transport layer, for other servers".
"""

from workbench.transport.agent_service import AgentService, serve
from workbench.transport.channel import AgentConnection, ExchangeConnection, Handler
from workbench.transport.exchange import ConnectionClosed, Exchange, RequestError
from workbench.transport.router import Router
from workbench.transport.runner import BackgroundServer
from workbench.transport.server import Endpoint, HttpServer, listen
from workbench.transport.unary import (
    AuthCheck,
    UnaryHandler,
    UnaryRequest,
    UnaryResponse,
    connect_error,
    typed_unary,
    unary_error,
)

__all__ = ["AgentConnection", "AgentService", "AuthCheck", "BackgroundServer", "ConnectionClosed", "Endpoint", "Exchange",
           "ExchangeConnection", "Handler", "HttpServer", "RequestError", "Router", "UnaryHandler", "UnaryRequest",
           "UnaryResponse", "connect_error", "listen", "serve", "typed_unary", "unary_error"]

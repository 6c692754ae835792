"""Who may talk to a workbench server: the Host and Origin checks shared by every local server.

``workbench proxy`` holds the user's Cursor token, the live read service answers SQL about
captured traffic and ``workbench replay`` plays recordings: all three listen on 127.0.0.1, which
any web page the user opens can reach. Two browser tricks get a page in:

- **DNS rebinding**: ``evil.example`` resolves to 127.0.0.1 after the page loaded, so the page's
  requests reach us as same-origin requests with ``Host: evil.example``. Refusing every ``Host``
  that is not a loopback name or address (or one the user allowed) stops it.
- **Cross-origin "simple" requests**: a page may POST ``text/plain`` to ``http://127.0.0.1:PORT``
  without a CORS preflight; the browser sends ``Origin: https://evil.example``. Refusing every
  request that carries an ``Origin`` the user did not allow stops it. Non-browser clients (the
  OpenAI SDK, curl, our own readers) send no ``Origin``.

CORS preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are always refused and no
server sends CORS headers, so no web page can read a workbench server's answers.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def host_name(value: str) -> str:
    """The host part of a ``Host`` / ``:authority`` value, lower-case, without port or brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return v[1:end] if end > 0 else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def is_loopback(name: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761) or a loopback IP address (127.0.0.0/8, ::1)."""
    n = host_name(name)
    if n == "localhost" or n.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(n)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


@dataclass(frozen=True)
class AccessPolicy:
    """Which ``Host`` names and browser ``Origin`` values a server accepts, and its optional key.

    ``api_key``: when set, every request must carry ``Authorization: Bearer <api_key>``.
    """

    allow_hosts: frozenset[str] = frozenset()
    allow_origins: frozenset[str] = frozenset()
    api_key: str | None = None

    @classmethod
    def build(cls, bind_host: str | None = None, allow_hosts: Iterable[str] = (),
              allow_origins: Iterable[str] = (), api_key: str | None = None) -> AccessPolicy:
        """A policy for a server bound to ``bind_host``: a specific address it was told to bind to
        is accepted as a Host too (clients use it), a wildcard bind (0.0.0.0, ::) is not."""
        hosts = {host_name(h) for h in allow_hosts if h.strip()}
        if bind_host:
            name = host_name(bind_host)
            try:
                if not ipaddress.ip_address(name).is_unspecified:
                    hosts.add(name)
            except ValueError:
                hosts.add(name)
        return cls(frozenset(hosts), frozenset(normalize_origin(o) for o in allow_origins if o.strip()),
                   api_key or None)

    def host_allowed(self, host: str) -> bool:
        return is_loopback(host) or "*" in self.allow_hosts or host_name(host) in self.allow_hosts

    def refusal(self, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """``(status, reason)`` when the request must be refused, else None.

        ``headers`` has lower-case names; an HTTP/2 ``:authority`` counts as ``host``.
        """
        host = headers.get("host") or headers.get(":authority")
        if host is not None and not self.host_allowed(host):
            return 403, (f"Host {host_name(host)!r} is not a loopback name or address (a DNS rebinding "
                         f"attempt?); start the server with --allow-host {host_name(host)} to accept it")
        if method.upper() == "OPTIONS" and "access-control-request-method" in headers:
            return 403, "CORS preflight refused: workbench servers do not serve web pages of other origins"
        origin = headers.get("origin")
        if origin is not None:
            norm = normalize_origin(origin)
            if norm not in self.allow_origins and "*" not in self.allow_origins:
                return 403, (f"requests from web pages are refused (Origin {origin.strip()!r}); start the "
                             f"server with --allow-origin {origin.strip()} to accept that origin")
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
                return 401, "missing or wrong API key: send Authorization: Bearer <key> (--api-key)"
        return None


LOOPBACK_ONLY = AccessPolicy()

"""The live read service of a capture in progress, its sidecar, and the handshake that proves it.

DuckDB lets one process hold a database file open for writing, and while it does, no other process
can open the file at all. A capture in progress therefore serves reads itself: the writing process
runs ``LiveService``, a loopback HTTP service that executes read-only SQL (``readonly.run_read``)
on its own connection and answers with Arrow IPC. It advertises itself in a sidecar file
``<db>.live.json`` (URL, token, pid; mode 0600).

A sidecar is a claim, not a proof: it outlives a killed capture, its pid may have been reused (PID
1 in a container is always alive), and anyone who can create a file next to the database can
write one. ``trusted_endpoint`` believes it only when all of these hold:

* the sidecar is a regular file, owned by the database file's owner and readable by nobody else;
* its URL is ``http://`` on a loopback address (never a name a resolver could answer);
* its pid is alive and, where the OS shows it (``/proc/<pid>/fd``), has the database file open;
* the service answers a fresh nonce with ``HMAC-SHA256(token, nonce, pid, st_dev, st_ino)`` for
  the sidecar's pid and the database file the reader sees at that path. Only a process that could
  read the 0600 sidecar knows the token, and the reader sends neither the token nor any SQL before
  this proof.

Each query's answer is signed the same way (over a per-query nonce and the body), so rows are
printed only if they come from the token's holder. A sidecar that fails any check is stale:
``reader.open_reader`` ignores it and opens the file read-only, as the README says.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import stat
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import duckdb

from workbench.security.origin import LOOPBACK_ONLY, AccessPolicy
from workbench.store.readonly import QueryRefused, ReadLimits, check_read_only, confine, run_read

if TYPE_CHECKING:  # the service's answers are Arrow; the module is imported by every reader
    import pyarrow as pa

__all__ = ["LiveEndpoint", "LiveService", "is_mac", "live_pid", "query_mac", "sidecar_path", "trusted_endpoint"]

# The live service never buffers a larger result than this, whatever a client asks for: the
# capture process must not run out of memory because of a reader.
LIVE_MAX_RESULT_BYTES = 1024 * 1024 * 1024
# A request body (SQL and parameters) larger than this is refused before it is read.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# A client that stops sending mid-request is dropped after this long (its thread is freed).
REQUEST_TIMEOUT_S = 30.0
# How long a reader waits for the handshake: a local service that cannot answer this fast is not
# one to send queries to.
HANDSHAKE_TIMEOUT_S = 10.0
TOKEN_HEADER = "x-workbench-token"
NONCE_HEADER = "x-workbench-nonce"
MAC_HEADER = "x-workbench-mac"
_NONCE = re.compile(r"[0-9a-f]{32,128}")
_LENGTH = re.compile(r"[0-9]{1,12}")
# A MAC as ``hello_mac``/``query_mac`` write it. Anything else is refused before comparing:
# ``hmac.compare_digest`` raises TypeError on a str that is not ASCII.
_MAC = re.compile(r"[0-9a-f]{64}")
# Above any pid an OS hands out (Linux: 2**22); os.kill raises OverflowError past a C int.
_MAX_PID = 2**31 - 1


def sidecar_path(db_path: str | Path) -> Path:
    return Path(str(db_path) + ".live.json")


def file_identity(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def hello_mac(token: str, nonce: str, pid: int, dev: int, ino: int) -> str:
    """The handshake's proof: only a holder of ``token`` can compute it for a fresh ``nonce``."""
    msg = f"workbench-live-hello\n{nonce}\n{pid}\n{dev}\n{ino}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def query_mac(token: str, nonce: str, status: int, body: bytes | memoryview) -> str:
    """A query answer's proof: signed by the token's holder for this request's nonce."""
    mac = hmac.new(token.encode(), f"workbench-live-answer\n{nonce}\n{status}\n".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def is_mac(text: str) -> bool:
    """``text`` has the form of a MAC this module writes (so ``hmac.compare_digest`` can take it)."""
    return _MAC.fullmatch(text) is not None


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---- the service ---------------------------------------------------------------------------

class _Server(ThreadingHTTPServer):
    daemon_threads = True
    service: LiveService


class _Handler(BaseHTTPRequestHandler):
    """One request to the live service. Every request gets an answer, a malformed one a 400."""

    timeout = REQUEST_TIMEOUT_S  # socket timeout: a half-sent request does not hold a thread

    @property
    def service(self) -> LiveService:
        return cast(_Server, self.server).service

    def do_OPTIONS(self) -> None:  # noqa: N802 - http.server naming
        if not self._refused(need_token=True):
            self._reply(405, b"use POST /query", "text/plain")

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.do_OPTIONS()

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        route = {"/query": self._query, "/hello": self._hello}.get(self.path)
        if self._refused(need_token=self.path != "/hello"):
            return
        try:
            if route is None:
                raise BadRequest(404, f"no such endpoint {self.path!r}: use POST /query")
            route(self._json_body())
        except BadRequest as exc:
            self._reply(exc.status, str(exc).encode(), "text/plain")
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def _refused(self, need_token: bool) -> bool:
        headers = {k.lower(): v for k, v in self.headers.items()}
        refusal = self.service.policy.refusal(self.command, headers)
        if refusal is not None:
            self._reply(refusal[0], refusal[1].encode(), "text/plain")
            return True
        if need_token and not hmac.compare_digest(self.headers.get(TOKEN_HEADER, "").encode(),
                                                  self.service.token.encode()):
            self._reply(403, b"bad token", "text/plain")
            return True
        return False

    def _json_body(self) -> dict[str, Any]:
        if self.headers.get("transfer-encoding"):
            raise BadRequest(400, "send the body with a content-length (transfer-encoding is not supported)")
        lengths = set(self.headers.get_all("content-length") or [])
        if len(lengths) != 1:
            raise BadRequest(400, "one content-length header is required")
        raw = lengths.pop().strip()
        if not _LENGTH.fullmatch(raw):
            raise BadRequest(400, f"content-length {raw[:40]!r} is not a length")
        n = int(raw)
        if n > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise BadRequest(413, f"request body of {n} bytes is over the {MAX_REQUEST_BYTES} byte limit")
        try:
            data = self.rfile.read(n)
        except TimeoutError as exc:
            self.close_connection = True
            raise BadRequest(400, f"request body incomplete after {REQUEST_TIMEOUT_S:g} s") from exc
        if len(data) < n:
            self.close_connection = True
            raise BadRequest(400, f"request body ended after {len(data)} of {n} bytes")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(400, f"request body is not JSON: {str(exc)[:200]}") from exc
        if not isinstance(doc, dict):
            raise BadRequest(400, f"request body must be a JSON object, not {type(doc).__name__}")
        return doc

    def _hello(self, req: dict[str, Any]) -> None:
        nonce = req.get("nonce")
        if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
            raise BadRequest(400, "hello needs a nonce: 32 to 128 lower-case hex digits")
        svc = self.service
        pid = os.getpid()
        dev, ino = svc.identity
        body = json.dumps({"pid": pid, "dev": dev, "ino": ino,
                           "mac": hello_mac(svc.token, nonce, pid, dev, ino)}).encode()
        self._reply(200, body, "application/json")

    def _query(self, req: dict[str, Any]) -> None:
        sql, params, limits_doc = req.get("sql"), req.get("params"), req.get("limits")
        if not isinstance(sql, str):
            raise BadRequest(400, "the request needs \"sql\": a string")
        if params is not None and not isinstance(params, list):
            raise BadRequest(400, "\"params\" must be a list")
        if limits_doc is not None and not isinstance(limits_doc, dict):
            raise BadRequest(400, "\"limits\" must be an object")
        nonce = self.headers.get(NONCE_HEADER, "")
        try:
            table = self.service.run(sql, params, ReadLimits.from_json(limits_doc, LIVE_MAX_RESULT_BYTES))
        except (QueryRefused, duckdb.Error, ValueError, TypeError, OverflowError) as exc:
            self._reply(400, str(exc).encode(), "text/plain", nonce)
            return
        except Exception as exc:  # the service outlives any one request
            self._reply(500, f"internal error: {type(exc).__name__}: {exc}".encode(), "text/plain", nonce)
            return
        import pyarrow as pa  # the service (the capture's process) answers in Arrow IPC

        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        self._reply(200, memoryview(sink.getvalue()), "application/vnd.apache.arrow.stream", nonce)

    def _reply(self, code: int, body: bytes | memoryview, ctype: str, nonce: str | None = None) -> None:
        try:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            if nonce and _NONCE.fullmatch(nonce):
                self.send_header(MAC_HEADER, query_mac(self.service.token, nonce, code, body))
            self.end_headers()
            self.wfile.write(body)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LiveService:
    """Serve read-only SQL over a writer's connection on 127.0.0.1 (started by the capture).

    Constructing it confines the writer's database instance (``readonly.confine``: no file or
    network access from SQL, configuration locked); the writer itself keeps inserting Arrow batches.
    Requests are checked for Host/Origin (``workbench.security.origin``) and the sidecar's token.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, db_path: str | Path, port: int = 0,
                 policy: AccessPolicy = LOOPBACK_ONLY) -> None:
        self.con = con
        self.db_path = str(db_path)
        self.policy = policy
        self.token = secrets.token_hex(16)
        # The file the writer holds, as a reader will see it at this path (proved in the handshake).
        self.identity = file_identity(self.db_path)
        self.cursor_lock = threading.Lock()
        confine(con)
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.service = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="workbench-live", daemon=True)

    def run(self, sql: str, params: list[Any] | None, limits: ReadLimits) -> pa.Table:
        check_read_only(sql)
        # Making and closing cursors on the writer's connection is not safe from several request
        # threads at once (a request was seen hanging); queries themselves run in parallel.
        with self.cursor_lock:
            cur = self.con.cursor()
        try:
            return run_read(cur, sql, params, limits)
        finally:
            with self.cursor_lock:
                cur.close()

    def start(self) -> None:
        self._thread.start()
        side = sidecar_path(self.db_path)
        tmp = side.with_suffix(".tmp")
        # A new file: one left behind (by a crash, or by anyone) keeps its mode and owner through
        # O_TRUNC, and a sidecar readable by others is one no reader trusts (nor should).
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"url": self.url, "token": self.token, "pid": os.getpid()}, fh)
        os.replace(tmp, side)

    def stop(self) -> None:
        sidecar_path(self.db_path).unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()


# ---- the reader's side: believe a sidecar only after the handshake --------------------------

@dataclass(frozen=True)
class LiveEndpoint:
    """A live service proved to hold the database: where it is and the token it knows."""

    url: str
    token: str
    pid: int


class Untrusted(Exception):
    """The sidecar was not believed; the message says why."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holds_file(pid: int, identity: tuple[int, int]) -> bool | None:
    """Whether ``pid`` has the file open (``/proc/<pid>/fd``); None when the OS does not show it."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except PermissionError:
        return None
    except FileNotFoundError:
        return False if os.path.isdir("/proc/self/fd") else None
    for name in names:
        try:
            st = os.stat(f"{fd_dir}/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == identity:
            return True
    return False


def read_sidecar(db_path: str | Path) -> dict[str, Any]:
    """The sidecar's claim, if its file is one the database's owner wrote for nobody else."""
    side = sidecar_path(db_path)
    try:
        fd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise Untrusted(f"cannot open it ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted("it is not a regular file")
        try:
            owner = os.stat(db_path).st_uid
        except OSError as exc:
            raise Untrusted(f"the database is not there ({exc.strerror})") from exc
        if st.st_uid != owner:
            raise Untrusted(f"it is owned by uid {st.st_uid}, the database by uid {owner}")
        if st.st_mode & 0o077:
            raise Untrusted(f"others may read or write it (mode {st.st_mode & 0o777:o}, a capture writes 0600)")
        try:
            doc = json.loads(fh.read(64 * 1024))
        except (ValueError, RecursionError) as exc:
            raise Untrusted("it is not JSON") from exc
    if not (isinstance(doc, dict) and isinstance(doc.get("url"), str) and isinstance(doc.get("token"), str)
            and type(doc.get("pid")) is int and 0 < doc["pid"] <= _MAX_PID):
        raise Untrusted("it lacks a url, token or pid")
    return doc


def loopback_url(url: str) -> str:
    """``url`` if it is ``http://<loopback address>:<port>``; Untrusted otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        address = ipaddress.ip_address(parts.hostname or "")
    except ValueError as exc:
        raise Untrusted(f"its URL {url[:80]!r} is not http://<loopback address>:<port>") from exc
    if (parts.scheme != "http" or port is None or not address.is_loopback or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username or parts.password):
        raise Untrusted(f"its URL {url[:80]!r} is not http://<loopback address>:<port>")
    return url.rstrip("/")


def _handshake(url: str, token: str, pid: int, identity: tuple[int, int]) -> None:
    nonce = secrets.token_hex(32)
    req = urllib.request.Request(url + "/hello", data=json.dumps({"nonce": nonce}).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    # The handshake goes to the sidecar's address only, never through a configured proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=HANDSHAKE_TIMEOUT_S) as resp:
            answer = resp.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        raise Untrusted(f"its service at {url} refused the handshake ({exc.code})") from exc
    except (OSError, ValueError) as exc:
        raise Untrusted(f"no service at {url} answered the handshake ({exc})") from exc
    try:
        doc = json.loads(answer)
    except (ValueError, RecursionError) as exc:
        raise Untrusted(f"the service at {url} did not answer the handshake (not JSON)") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("mac"), str) or not _MAC.fullmatch(doc["mac"]):
        raise Untrusted(f"the service at {url} did not answer the handshake")
    try:
        claimed = (int(doc["pid"]), int(doc["dev"]), int(doc["ino"]))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(Infinity)
        raise Untrusted(f"the service at {url} did not answer the handshake") from exc
    if not hmac.compare_digest(doc["mac"], hello_mac(token, nonce, *claimed)):
        raise Untrusted(f"the service at {url} does not know the sidecar's token")
    if claimed[0] != pid:
        raise Untrusted(f"the service at {url} is pid {claimed[0]}, the sidecar names pid {pid}")
    if claimed[1:] != identity:
        raise Untrusted(f"the service at {url} holds another file than this path names")


def trusted_endpoint(db_path: str | Path) -> LiveEndpoint:
    """The live service serving ``db_path``, proved (module docstring); Untrusted says why not."""
    doc = read_sidecar(db_path)
    url = loopback_url(doc["url"])
    pid = int(doc["pid"])
    if not pid_alive(pid):
        raise Untrusted(f"its process {pid} is gone")
    identity = file_identity(db_path)
    if holds_file(pid, identity) is False:
        raise Untrusted(f"its process {pid} does not have the database open")
    _handshake(url, doc["token"], pid, identity)
    return LiveEndpoint(url, doc["token"], pid)


def live_pid(db_path: str | Path) -> int | None:
    """The pid of the capture serving ``db_path``, proved by ``trusted_endpoint``; None when no
    capture does (no sidecar, or a stale one: its pid may still name some running process)."""
    if not sidecar_path(db_path).exists():
        return None
    try:
        return trusted_endpoint(db_path).pid
    except (Untrusted, OSError):
        return None

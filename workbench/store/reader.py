"""Readers of a capture database, including one that is being written right now.

DuckDB lets one process hold a database file open for writing, and while it does, no other process
can open the file at all. A capture in progress therefore serves reads itself: the writing process
runs a small loopback HTTP service (``LiveService``) that executes read-only SQL on its own
connection and answers with Arrow IPC. It advertises itself in a sidecar file ``<db>.live.json``
(URL, token, pid; mode 0600). ``open_reader`` uses the sidecar when its process is alive and opens
the file read-only otherwise, so the CLI, TUI and notebooks run the same SQL either way. Readers
see committed data only (DuckDB MVCC), so polling ``WHERE seq > last_seen`` never duplicates or
skips a frame.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from workbench.security.origin import LOOPBACK_ONLY, AccessPolicy
from workbench.store.db import (
    StoreError,
    _lock_message,
    check_version,
    damage_message,
    is_damage,
    open_message,
)
from workbench.store.readonly import (
    QueryRefused,
    ReadLimits,
    check_read_only,
    confine,
    run_read,
)
from workbench.store.schema import SchemaVersionError

__all__ = ["LiveService", "LocalReader", "ReadLimits", "Reader", "RemoteReader", "check_read_only",
           "open_reader", "sidecar_path"]

# The live service never buffers a larger result than this, whatever a client asks for: the
# capture process must not run out of memory because of a reader.
LIVE_MAX_RESULT_BYTES = 1024 * 1024 * 1024


class Reader(Protocol):
    path: str
    live: bool

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...

    def close(self) -> None: ...


def sidecar_path(db_path: str | Path) -> Path:
    return Path(str(db_path) + ".live.json")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalReader:
    """A database file nobody is writing: opened read-only, confined (``readonly.confine``).

    ``allow_dir``: a directory SQL may still write to (``workbench export`` only).
    """

    live = False

    def __init__(self, path: str | Path, limits: ReadLimits | None = None, *,
                 allow_dir: str | Path | None = None) -> None:
        self.path = str(path)
        self.limits = limits or ReadLimits()
        if not Path(self.path).exists():
            raise StoreError(f"{self.path}: no such capture database")
        try:
            self.con = duckdb.connect(self.path, read_only=True)
        except duckdb.IOException as exc:
            raise StoreError(_lock_message(self.path, exc)) from exc
        except duckdb.Error as exc:
            raise StoreError(open_message(self.path, exc)) from exc
        try:
            confine(self.con, [str(allow_dir)] if allow_dir is not None else [])
            check_version(self.con, self.path)
        except SchemaVersionError as exc:
            self.con.close()
            raise StoreError(str(exc)) from exc
        except duckdb.Error as exc:
            self.con.close()
            raise StoreError(open_message(self.path, exc)) from exc
        self._lock = threading.Lock()

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self._lock:
            try:
                return run_read(self.con, sql, params, self.limits)
            except duckdb.Error as exc:
                if is_damage(exc):
                    raise StoreError(damage_message(self.path, exc)) from exc
                raise

    def close(self) -> None:
        self.con.close()


class RemoteReader:
    """A capture in progress, read through the writer's loopback service."""

    live = True

    def __init__(self, path: str | Path, url: str, token: str, limits: ReadLimits | None = None) -> None:
        self.path = str(path)
        self.url = url
        self.token = token
        self.limits = limits or ReadLimits()

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        body = json.dumps({"sql": sql, "params": list(params or []), "limits": self.limits.as_json()},
                          default=str).encode()
        req = urllib.request.Request(self.url + "/query", data=body, method="POST",
                                     headers={"content-type": "application/json",
                                              "x-workbench-token": self.token})
        # The service interrupts the query at its time limit; wait a little longer than that.
        wait = (self.limits.timeout_s or 24 * 3600.0) + 30
        try:
            with urllib.request.urlopen(req, timeout=wait) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            raise StoreError(f"{self.path} (live): {exc.read().decode(errors='replace')}") from exc
        except OSError as exc:
            raise StoreError(f"{self.path} (live): read service at {self.url} unreachable: {exc}") from exc
        return pa.ipc.open_stream(data).read_all()

    def close(self) -> None:
        pass


def open_reader(path: str | Path, limits: ReadLimits | None = None, *,
                allow_dir: str | Path | None = None) -> LocalReader | RemoteReader:
    """The right reader for ``path``: live service if a capture holds it, else read-only file.

    ``allow_dir``: a directory a file reader's SQL may write to (``workbench export`` only).
    """
    side = sidecar_path(path)
    if side.exists():
        try:
            info = json.loads(side.read_text())
            if _pid_alive(int(info["pid"])):
                return RemoteReader(path, info["url"], info["token"], limits)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return LocalReader(path, limits, allow_dir=allow_dir)


class LiveService:
    """Serve read-only SQL over a writer's connection on 127.0.0.1 (started by the capture).

    Constructing it confines the writer's database instance (``readonly.confine``: no file or
    network access from SQL, configuration locked); the writer itself keeps inserting Arrow batches.
    Requests are checked for Host/Origin (``workbench.security.origin``) and the sidecar's token.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, db_path: str | Path, port: int = 0,
                 policy: AccessPolicy = LOOPBACK_ONLY) -> None:
        self.db_path = str(db_path)
        self.token = secrets.token_hex(16)
        self.cursor_lock = threading.Lock()
        confine(con)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _refused(self) -> bool:
                headers = {k.lower(): v for k, v in self.headers.items()}
                refusal = policy.refusal(self.command, headers)
                if refusal is not None:
                    self._reply(refusal[0], refusal[1].encode(), "text/plain")
                    return True
                if not hmac.compare_digest(self.headers.get("x-workbench-token", "").encode(),
                                           service.token.encode()):
                    self._reply(403, b"bad token", "text/plain")
                    return True
                return False

            def do_OPTIONS(self) -> None:  # noqa: N802 - http.server naming
                if not self._refused():
                    self._reply(405, b"use POST /query", "text/plain")

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                self.do_OPTIONS()

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                if self._refused():
                    return
                try:
                    n = int(self.headers.get("content-length") or 0)
                    req = json.loads(self.rfile.read(n))
                    limits = ReadLimits.from_json(req.get("limits"), LIVE_MAX_RESULT_BYTES)
                    check_read_only(req["sql"])
                    # Making and closing cursors on the writer's connection is not safe from
                    # several request threads at once (a request was seen hanging); queries
                    # themselves run in parallel on their own cursors.
                    with service.cursor_lock:
                        cur = con.cursor()
                    try:
                        table = run_read(cur, req["sql"], req.get("params"), limits)
                    finally:
                        with service.cursor_lock:
                            cur.close()
                except (QueryRefused, ValueError, KeyError, TypeError, duckdb.Error) as exc:
                    self._reply(400, str(exc).encode(), "text/plain")
                    return
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as w:
                    w.write_table(table)
                self._reply(200, memoryview(sink.getvalue()), "application/vnd.apache.arrow.stream")

            def _reply(self, code: int, body: bytes | memoryview, ctype: str) -> None:
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="workbench-live", daemon=True)

    def start(self) -> None:
        self._thread.start()
        side = sidecar_path(self.db_path)
        tmp = side.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"url": self.url, "token": self.token, "pid": os.getpid()}, fh)
        os.replace(tmp, side)

    def stop(self) -> None:
        sidecar_path(self.db_path).unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()

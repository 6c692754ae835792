"""Readers of a capture database, including one that is being written right now.

A database nobody writes is opened read-only (``LocalReader``). One a capture is writing is read
through the capture's live read service (``RemoteReader``; the service and the proof that a
sidecar is genuine are in ``workbench.store.live``). ``open_reader`` picks: the live service when
its sidecar ``<db>.live.json`` passes the handshake, the file otherwise (a stale or unprovable
sidecar is ignored), so the CLI, TUI and notebooks run the same named reads (``workbench.store.queries``) either way. Readers see
committed data only (DuckDB MVCC), so polling ``WHERE seq > last_seen`` never duplicates or skips
a frame.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from workbench.store.arrow_rows import table_rows
from workbench.store.connection import (
    StoreError,
    check_version,
    connect,
    damage_message,
    is_damage,
    open_message,
)
from workbench.store.live import (
    MAC_HEADER,
    NONCE_HEADER,
    TOKEN_HEADER,
    LiveService,
    Untrusted,
    is_mac,
    live_pid,
    pid_alive,
    query_mac,
    sidecar_path,
    trusted_endpoint,
)
from workbench.store.queries import Reader, Row
from workbench.store.readonly import ReadLimits, check_read_only, confine, fetch_rows, run_read, run_rows
from workbench.store.schema import SchemaVersionError
from workbench.textsafe import escape_display

if TYPE_CHECKING:  # Arrow results are loaded where they are asked for: ``rows`` needs no pyarrow
    import pyarrow as pa

__all__ = ["ConnectionReader", "LiveService", "LocalReader", "live_pid", "ReadLimits", "Reader", "RemoteReader", "check_read_only",
           "open_reader", "sidecar_path"]

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
        self.con = connect(self.path, read_only=True)
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
        return self._read(run_read, sql, params)

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        return self._read(run_rows, sql, params)

    def _read(self, run: Any, sql: str, params: Sequence[Any] | None) -> Any:
        with self._lock:
            try:
                return run(self.con, sql, params, self.limits)
            except duckdb.Error as exc:
                if is_damage(exc):
                    raise StoreError(damage_message(self.path, exc)) from exc
                raise

    def close(self) -> None:
        self.con.close()


class RemoteReader:
    """A capture in progress, read through the writer's loopback service.

    ``pid``: the service's process, when proved by the handshake (``open_reader``); a query is then
    not sent once that process is gone. Every answer with rows must carry the token holder's
    signature over this query's nonce (``live.query_mac``), so rows from anything else listening
    on the port are never returned.
    """

    live = True

    def __init__(self, path: str | Path, url: str, token: str, limits: ReadLimits | None = None,
                 pid: int | None = None) -> None:
        self.path = str(path)
        self.url = url
        self.token = token
        self.pid = pid
        self.limits = limits or ReadLimits()
        # Loopback only: a configured HTTP proxy must never see the token or the query.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        if self.pid is not None and not pid_alive(self.pid):
            raise StoreError(f"{self.path} (live): the capture (pid {self.pid}) has stopped")
        nonce = secrets.token_hex(16)
        body = json.dumps({"sql": sql, "params": list(params or []), "limits": self.limits.as_json()},
                          default=str).encode()
        req = urllib.request.Request(self.url + "/query", data=body, method="POST",
                                     headers={"content-type": "application/json", TOKEN_HEADER: self.token,
                                              NONCE_HEADER: nonce})
        # The service interrupts the query at its time limit; wait a little longer than that.
        wait = (self.limits.timeout_s or 24 * 3600.0) + 30
        try:
            with self._opener.open(req, timeout=wait) as resp:
                data = resp.read()
                mac = resp.headers.get(MAC_HEADER, "")
        except urllib.error.HTTPError as exc:
            # the service's message, through the one printer (workbench.textsafe)
            raise StoreError(f"{self.path} (live): "
                             f"{escape_display(exc.read().decode(errors='replace'), layout=True)[:4000]}") from exc
        except OSError as exc:
            raise StoreError(f"{self.path} (live): read service at {self.url} unreachable: {exc}") from exc
        if not (is_mac(mac) and hmac.compare_digest(mac, query_mac(self.token, nonce, 200, data))):
            raise StoreError(f"{self.path} (live): the answer from {self.url} is not signed with the capture's "
                             "token; its rows are not shown")
        import pyarrow as pa  # the service answers in Arrow IPC

        return pa.ipc.open_stream(data).read_all()

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        return table_rows(self.query(sql, params))

    def close(self) -> None:
        pass


class ConnectionReader:
    """A ``Reader`` over a DuckDB connection someone else opened (a notebook's, or a file being
    checked before it is replaced), so the named reads work on it as on any capture."""

    live = False

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str = "(connection)") -> None:
        self.con = con
        self.path = path

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        import pyarrow as pa  # a notebook connection: the Arrow read is what was asked for

        rel = self.con.sql(sql, params=list(params) if params else None)
        return rel.to_arrow_table() if rel is not None else pa.table({})

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        # on the connection itself, as ``query``: a cursor is a connection of its own, without the
        # notebook's ``USE capture`` (its tables were not found, and session_overview failed)
        return fetch_rows(self.con.execute(sql, list(params) if params else None))

    def close(self) -> None:
        pass  # the connection is its opener's to close


def open_reader(path: str | Path, limits: ReadLimits | None = None, *,
                allow_dir: str | Path | None = None) -> LocalReader | RemoteReader:
    """The right reader for ``path``: live service if a capture proves it holds it, else the file.

    A sidecar that does not pass ``live.trusted_endpoint`` is stale: ignored, the file opened
    read-only. If the file cannot be opened either, the error says why the sidecar was not used.
    ``allow_dir``: a directory a file reader's SQL may write to (``workbench export`` only).
    """
    why = ""
    if sidecar_path(path).exists():
        try:
            live = trusted_endpoint(path)
        except Untrusted as exc:
            why = str(exc)
        except OSError as exc:
            why = f"it could not be checked ({exc})"
        else:
            return RemoteReader(path, live.url, live.token, limits, pid=live.pid)
    try:
        return LocalReader(path, limits, allow_dir=allow_dir)
    except StoreError as exc:
        if why:
            raise StoreError(f"{exc} (its live sidecar {sidecar_path(path)} was ignored: {why})") from exc
        raise

"""The live read service (workbench.store.live): a sidecar is believed only after the handshake,
and every malformed request gets a 400 while the service keeps serving (issue 20, findings 8, 9)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from support import run_workbench

from workbench.decode.classify import Frame
from workbench.store import LiveService, SessionInfo, Store, StoreError, now_us
from workbench.store.live import Untrusted, hello_mac, trusted_endpoint
from workbench.store.reader import LocalReader, RemoteReader, open_reader, sidecar_path
from workbench.store.recorder import Recorder

FAKE_ROWS = "rows-from-a-fake-service"


def _db(path: Path, n: int = 7) -> Path:
    with Store(path) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo("real-session", transport="run", status="complete"))
        for i in range(n):
            rec.add("real-session", now_us(), "server", "run", "1",
                    Frame("interaction_update.text_delta", f"text {i}", b"\x0a\x02\x0a\x00"))
        rec.flush()
    return path


def _sidecar(db: Path, url: str, token: str, pid: int, mode: int = 0o600) -> None:
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": url, "token": token, "pid": pid}))
    os.chmod(side, mode)


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue())


class FakeService:
    """Something else listening on loopback: records every request, answers every one with rows.

    ``knows``: the token it can sign the handshake with (it read or wrote the sidecar), else None.
    ``hello``: a handshake answer to send as it is (any JSON text); ``mac``: a signature header to
    put on every answer.
    """

    def __init__(self, knows: str | None = None, claim_pid: int | None = None,
                 claim_file: Path | None = None, hello: str | None = None, mac: str = "") -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                fake.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if self.path == "/hello" and hello is not None:
                    out, ctype = hello.encode(), "application/json"
                elif self.path == "/hello":
                    st = os.stat(claim_file) if claim_file else None
                    pid = claim_pid or os.getpid()
                    dev, ino = (st.st_dev, st.st_ino) if st else (0, 0)
                    nonce = json.loads(body)["nonce"]
                    out = json.dumps({"pid": pid, "dev": dev, "ino": ino,
                                      "mac": hello_mac(knows or "a guess", nonce, pid, dev, ino)}).encode()
                    ctype = "application/json"
                else:
                    out = _arrow(pa.table({"n": [FAKE_ROWS]}))
                    ctype = "application/vnd.apache.arrow.stream"
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(out)))
                if mac:
                    self.send_header("x-workbench-mac", mac)
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def saw(self, text: str) -> bool:
        return any(text.encode() in body or text in json.dumps(headers) for _, headers, body in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeService]:
    svc = FakeService()
    yield svc
    svc.close()


@pytest.mark.slow
@pytest.mark.parametrize("pid", [os.getpid(), 1], ids=["this-test", "pid-1"])
def test_alive_pid_that_does_not_hold_the_file_is_a_stale_sidecar(tmp_path: Path, pid: int) -> None:
    """Finding 8: a reused pid (or PID 1 in a container) made every reader fail."""
    db = _db(tmp_path / "cap.duckdb")
    _sidecar(db, "http://127.0.0.1:9", "tok", pid)
    reader = open_reader(db)
    try:
        assert isinstance(reader, LocalReader)
        assert reader.query("SELECT count(*) AS n FROM frames").column("n").to_pylist() == [7]
    finally:
        reader.close()
    r = run_workbench("sql", "SELECT count(*) AS n FROM frames", "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"n": 7}


@pytest.mark.slow
def test_fake_service_on_another_port_never_gets_the_query(tmp_path: Path, fake: FakeService) -> None:
    """Finding 8: a fake service named by a sidecar received the user's query and its rows were printed."""
    db = _db(tmp_path / "cap.duckdb")
    _sidecar(db, fake.url, "the-sidecar-token", os.getpid())
    secret_sql = "SELECT count(*) AS n FROM frames WHERE kind <> 'user-secret-filter'"
    r = run_workbench("sql", secret_sql, "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"n": 7}
    assert FAKE_ROWS not in r.stdout
    assert not fake.saw("user-secret-filter")
    assert not fake.saw("the-sidecar-token")
    assert all(path == "/hello" for path, _, _ in fake.requests)


@pytest.mark.slow
def test_fake_service_that_knows_the_token_is_still_not_trusted(tmp_path: Path) -> None:
    """A service that wrote the sidecar itself can sign the handshake; it is still refused when the
    sidecar's pid does not hold the file, or when it claims another pid or another file."""
    db = _db(tmp_path / "cap.duckdb")
    cases = [(FakeService(knows="tok", claim_file=db), False, "does not have the database open"),
             (FakeService(knows="tok", claim_pid=1, claim_file=db), True, "is pid 1, the sidecar names pid"),
             (FakeService(knows="tok", claim_file=tmp_path), True, "holds another file"),
             (FakeService(knows="another-token", claim_file=db), True, "does not know the sidecar's token")]
    for fake, hold, why in cases:
        # ``hold``: this process (the sidecar's pid) has the file open, as a capture would
        holder = duckdb.connect(str(db), read_only=True) if hold else None
        try:
            _sidecar(db, fake.url, "tok", os.getpid())
            with pytest.raises(Untrusted, match=why):
                trusted_endpoint(db)
            reader = open_reader(db)
            assert isinstance(reader, LocalReader)
            assert reader.query("SELECT count(*) AS n FROM frames").column("n").to_pylist() == [7]
            reader.close()
            assert [p for p, _, _ in fake.requests if p != "/hello"] == []
        finally:
            if holder is not None:
                holder.close()
            fake.close()


@pytest.mark.slow
def test_sidecar_checks_before_any_connection(tmp_path: Path, fake: FakeService) -> None:
    db = _db(tmp_path / "cap.duckdb")
    store = Store(tmp_path / "held.duckdb")  # a database this process holds: only its service may serve it
    svc = LiveService(store.con, tmp_path / "held.duckdb")
    svc.start()
    held = tmp_path / "held.duckdb"
    try:
        assert isinstance(open_reader(held), RemoteReader)
        real = json.loads(sidecar_path(held).read_text())
        # a sidecar others could have written or read is not believed, even naming the real service
        os.chmod(sidecar_path(held), 0o644)
        with pytest.raises(StoreError, match=r"live sidecar .* was ignored: others may read or write it"):
            open_reader(held)
        os.chmod(sidecar_path(held), 0o600)
        # the URL must be a loopback address, not a name
        for url in ("http://localhost:" + real["url"].rsplit(":", 1)[1], "http://10.1.2.3:80",
                    "https://127.0.0.1:1", "http://127.0.0.1:1/elsewhere", "file:///etc/passwd"):
            _sidecar(held, url, real["token"], real["pid"])
            with pytest.raises(StoreError, match="is not http://<loopback address>"):
                open_reader(held)
        # the real token, a fake URL: the fake cannot sign the handshake
        _sidecar(held, fake.url, real["token"], real["pid"])
        with pytest.raises(StoreError, match="does not know the sidecar's token"):
            open_reader(held)
        assert [p for p, _, _ in fake.requests] == ["/hello"]
        assert not fake.saw(real["token"])
        # a sidecar for another database (copied next to this one): the service holds another file
        _sidecar(db, real["url"], real["token"], real["pid"])
        with pytest.raises(Untrusted, match="does not have the database open"):
            trusted_endpoint(db)
        _sidecar(held, real["url"], real["token"], real["pid"])
        assert trusted_endpoint(held).url == svc.url
    finally:
        svc.stop()
        store.close()


@pytest.mark.slow
def test_answers_without_the_services_signature_are_not_shown(tmp_path: Path, fake: FakeService) -> None:
    """Something that took over the port after the handshake: its rows never reach the caller."""
    reader = RemoteReader(tmp_path / "x.duckdb", fake.url, "tok")
    with pytest.raises(StoreError, match="not signed with the capture's token"):
        reader.query("SELECT 1")
    # a reader proved against a process that has since exited sends nothing
    before = len(fake.requests)
    with pytest.raises(StoreError, match="has stopped"):
        RemoteReader(tmp_path / "x.duckdb", fake.url, "tok", pid=2**22 + 12345).query("SELECT 1")
    assert len(fake.requests) == before


# ---- malformed requests ----------------------------------------------------------------------

def _raw(url: str, request: bytes, *, shut_write: bool = False) -> tuple[int, str]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(request)
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                if length and len(rest) >= length[0]:
                    break
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2].decode(errors="replace")


def _post(token: str, body: bytes, headers: str | None = None, path: str = "/query") -> bytes:
    head = headers if headers is not None else f"Content-Length: {len(body)}\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-workbench-token: {token}\r\n"
            f"Content-Type: application/json\r\n{head}\r\n").encode() + body


@pytest.mark.slow
def test_malformed_requests_get_400_and_the_service_keeps_serving(tmp_path: Path) -> None:
    """Finding 9: `[1]` dropped the connection; `Content-Length: -1` left a thread waiting."""
    db = _db(tmp_path / "cap.duckdb")
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    t = svc.token
    ok = json.dumps({"sql": "SELECT count(*) AS n FROM frames"}).encode()
    cases: list[tuple[bytes, bool, int, str]] = [
        (_post(t, b"[1]"), False, 400, "must be a JSON object"),
        (_post(t, b"", "Content-Length: -1\r\n"), False, 400, "is not a length"),
        (_post(t, b"", "Content-Length: abc\r\n"), False, 400, "is not a length"),
        (_post(t, ok, ""), False, 400, "content-length header is required"),
        (_post(t, ok, f"Content-Length: {len(ok)}\r\nContent-Length: 3\r\n"), False, 400, "content-length"),
        (_post(t, b"3\r\nabc\r\n0\r\n\r\n", "Transfer-Encoding: chunked\r\n"), False, 400, "transfer-encoding"),
        (_post(t, b"", "Content-Length: 99999999999\r\n"), False, 413, "over the"),
        (_post(t, b'{"sql": "SEL', "Content-Length: 50\r\n"), True, 400, "ended after 12 of 50 bytes"),
        (_post(t, b"{"), False, 400, "not JSON"),
        (_post(t, b"\xff\xfe"), False, 400, "not JSON"),
        (_post(t, b"[" * 200_000 + b"]" * 200_000), False, 400, "not JSON"),
        (_post(t, b'"SELECT 1"'), False, 400, "must be a JSON object"),
        (_post(t, b'{"sql": 1}'), False, 400, '"sql"'),
        (_post(t, b'{"sql": "SELECT 1", "params": "x"}'), False, 400, '"params"'),
        (_post(t, b'{"sql": "SELECT 1", "limits": [1]}'), False, 400, '"limits"'),
        (_post(t, b'{"sql": "SELECT ?", "params": [{"a": [1, {"b": null}]}, 2]}'), False, 400, ""),
        (_post(t, b'{"sql": "SELECT * FROM checkpoint()"}'), False, 400, "checkpoint()"),
        (_post(t, b'{}', path="/hello"), False, 400, "nonce"),
        (_post(t, b'{"nonce": "../../x"}', path="/hello"), False, 400, "nonce"),
        (_post(t, ok, path="/other"), False, 404, "no such endpoint"),
    ]
    try:
        for request, shut, status, text in cases:
            got, body = _raw(svc.url, request, shut_write=shut)
            assert (got, text in body) == (status, True), (request[:120], got, body)
            # and the service still answers a good request
            got, body = _raw(svc.url, _post(t, ok))
            assert got == 200, body
        # a huge time limit is clamped, not a timer that overflows in the service
        got, _ = _raw(svc.url, _post(t, b'{"sql": "SELECT 1", "limits": {"timeout_s": 1e308}}'))
        assert got == 200
        assert open_reader(db).query("SELECT count(*) AS n FROM frames").column("n").to_pylist() == [7]
    finally:
        svc.stop()
        store.close()


@pytest.mark.slow
def test_half_sent_request_is_dropped_at_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.store import live

    monkeypatch.setattr(live._Handler, "timeout", 1.0)
    db = _db(tmp_path / "cap.duckdb")
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        status, body = _raw(svc.url, _post(svc.token, b'{"sql"', "Content-Length: 40\r\n"))
        assert status == 400 and "incomplete" in body, body
    finally:
        svc.stop()
        store.close()


@pytest.mark.slow
def test_odd_handshake_answers_and_sidecars_are_untrusted_not_tracebacks(tmp_path: Path) -> None:
    """A non-ASCII mac (hmac.compare_digest raised TypeError), a pid of Infinity (OverflowError) in the
    handshake, and a sidecar pid past the OS's range (os.kill raised OverflowError) escaped
    ``open_reader``: every reader of the database crashed instead of ignoring the stale sidecar."""
    db = _db(tmp_path / "cap.duckdb")
    holder = duckdb.connect(str(db), read_only=True)  # this process holds the file, as a capture would
    try:
        answers = ['{"pid": 1, "dev": 1, "ino": 1, "mac": "\\u00e9"}',
                   '{"pid": 1, "dev": 1, "ino": 1, "mac": "\\ud800"}',
                   '{"pid": Infinity, "dev": 1, "ino": 1, "mac": "00"}']
        for hello in answers:
            odd = FakeService(hello=hello)
            try:
                _sidecar(db, odd.url, "tok", os.getpid())
                with pytest.raises(Untrusted, match="did not answer the handshake"):
                    trusted_endpoint(db)
            finally:
                odd.close()
    finally:
        holder.close()
    for pid in (2**40, 2**63):
        _sidecar(db, "http://127.0.0.1:9", "tok", pid)
        with pytest.raises(Untrusted, match="lacks a url, token or pid"):
            trusted_endpoint(db)
        reader = open_reader(db)
        assert isinstance(reader, LocalReader)
        reader.close()
    # rows whose signature header is not even ASCII are refused like unsigned ones
    odd = FakeService(mac="\u00e9" * 64)
    try:
        with pytest.raises(StoreError, match="not signed with the capture's token"):
            RemoteReader(tmp_path / "x.duckdb", odd.url, "tok").query("SELECT 1")
    finally:
        odd.close()


@pytest.mark.slow
def test_a_leftover_sidecar_tmp_does_not_widen_the_sidecar(tmp_path: Path) -> None:
    """The sidecar was written through ``<db>.live.tmp`` opened with O_TRUNC: a leftover one kept its
    mode (0644), so the capture's own sidecar was readable by others and trusted by no reader."""
    db = _db(tmp_path / "cap.duckdb")
    leftover = sidecar_path(db).with_suffix(".tmp")
    leftover.write_text("left by a crash")
    os.chmod(leftover, 0o644)
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        assert os.stat(sidecar_path(db)).st_mode & 0o777 == 0o600
        assert trusted_endpoint(db).url == svc.url
    finally:
        svc.stop()
        store.close()

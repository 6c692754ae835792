"""Source: live capture, a real mitmdump with the capture addon between a hostile HTTP/2 client and a
hostile HTTP/2 upstream (live.py): header values with arbitrary bytes both ways, a non-UTF-8
``grpc-message``, odd trailers, server resets, canaries in every credential header and field
(plain and gzip'd, inflated or kept ``compressed`` under a tiny per-frame budget).

Invariants: (a) mitmdump exits cleanly on SIGINT and its log holds no traceback, and every view
of the database exits cleanly; (b) every envelope of every exchange the upstream answered is a
stored frame of its session (nothing left in a spool, no frame without its session row); (c) the
canary is on no file the capture wrote (database and its tables read back, WAL, spool, sidecar,
mitmdump's log) nor in any view or export.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, query, view_outputs
from live import HostileUpstream, send
from strategies import Exchange, exchanges, hostile, tried
from support import BIN, env_without_proxy, free_port, wait_port

pytestmark = pytest.mark.slow
ADDON = Path(__file__).resolve().parents[2] / "addons" / "cursor_capture.py"
TINY_BUDGET = "0.00005"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileUpstream]:
    server = HostileUpstream(tmp_path_factory.mktemp("hostile-upstream-cert"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-mitmconf")


def _mitmdump(run: Path, confdir: Path, tiny_budget: bool) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = run / "mitmdump.log"
    env = env_without_proxy({"WORKBENCH_INFLATE_FRAME_MB": TINY_BUDGET} if tiny_budget else None)
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "--listen-host", "127.0.0.1", "--listen-port", str(port),
             "--set", f"confdir={confdir}", "--set", "ssl_insecure=true", "--set", f"cursor_db={run / 'capture.duckdb'}",
             "--set", "cursor_flush_ms=100"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    wait_port(port, proc)
    return proc, port, log


@hostile(5)
@given(batch=st.lists(exchanges(wire_safe=True, timestamps_too=False), min_size=1, max_size=4),
       tiny_budget=st.booleans())
def test_capture_hostile_wire(batch: list[Exchange], tiny_budget: bool, upstream: HostileUpstream, confdir: Path,
                              scratch: Callable[[], Path]) -> None:
    tried("test_capture_hostile_wire")
    run = scratch() / "run"
    proc, port, log = _mitmdump(run, confdir, tiny_budget)
    ends: dict[str, str] = {}
    answers: dict[str, list[bytes]] = {}
    try:
        for ex in batch:
            key = uuid.uuid4().hex.encode()
            upstream.script[key] = ex
            rid = str(uuid.uuid4())
            answers[rid] = []
            ends[rid] = send(port, upstream.port, confdir / "mitmproxy-ca-cert.pem", key, ex, rid,
                             received=answers[rid])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("mitmdump did not stop within 60 s of SIGINT") from None
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, f"mitmdump logged a traceback:\n{text[-3000:]}"  # (a)
    assert rc == 0, f"mitmdump exited {rc}:\n{text[-2000:]}"
    db = run / "capture.duckdb"
    spools = [p.name for p in run.iterdir() if "spool" in p.name]
    assert not spools, f"frames left in a spool after a clean stop: {spools}; log:\n{text[-2000:]}"  # (b)
    orphans = query(db, "SELECT count(*) FROM frames f ANTI JOIN sessions s USING (session_id)")[0][0]
    assert orphans == 0, f"{orphans} frames stored without their session row"
    for (rid, end), ex in zip(ends.items(), batch, strict=True):
        if end == "refused":  # the proxy refused the request before the upstream saw it
            continue
        got = query(db, "SELECT count(*) FROM frames f JOIN sessions s USING (session_id) WHERE s.request_id = ?",
                    rid)[0][0]
        client_got = _envelopes(b"".join(answers[rid]))
        # What went in through the proxy: everything, when the answer ended as sent; when the stream
        # was reset on the way (mitmproxy's HTTP/2 stack refuses an upstream frame, e.g. a trailer it
        # cannot take, and drops the frames it read with it), what the client sent and what reached it.
        went_in = ex.frames_in if end == "ended" else len(ex.client_sites) + client_got
        assert got >= went_in, (f"request {rid} ({end}): {went_in} envelopes went through the proxy "
                                f"({ex.frames_in} sent, {client_got} server envelopes reached the client), {got} stored")
    outputs = view_outputs(db, run / "out")
    for ex in batch:  # (c)
        canary_nowhere(run, ex.canary, outputs)


def _envelopes(body: bytes) -> int:
    """Complete Connect envelopes at the start of ``body``."""
    pos = n = 0
    while pos + 5 <= len(body) and pos + 5 + int.from_bytes(body[pos + 1:pos + 5], "big") <= len(body):
        pos += 5 + int.from_bytes(body[pos + 1:pos + 5], "big")
        n += 1
    return n

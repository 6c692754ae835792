"""Runs written while a capture is still read (``workbench.ingest.pcap_early``) store what reading
the whole capture first stores, also when a packet after a connection's end changes an exchange,
or when a capture holds the same connection twice.

Packets as tshark reports them (``Packet``, ``H2Frame``) go through the importer's own path twice:
pipelined (``EarlyRuns``, sessions written as their connection ends) and all at the end
(``write_exchanges``, the path of flow and HAR files). Every row must be the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import query_rows

from workbench.decode.classify import default_decoder
from workbench.ingest.exchange_import import write_exchanges
from workbench.ingest.pcap import SOURCE, WirePlanBuilder, capture_importer
from workbench.ingest.pcap_early import EarlyRuns
from workbench.ingest.pcap_streams import Reassembler, agent_exchanges
from workbench.ingest.progress import Progress
from workbench.ingest.tshark import (
    H2_DATA,
    H2_END_HEADERS,
    H2_END_STREAM,
    H2_HEADERS,
    H2_RST_STREAM,
    TCP_ACK,
    TCP_FIN,
    TCP_RST,
    TCP_SYN,
    H2Frame,
    Packet,
)
from workbench.store.db import Store
from workbench.wire.envelope import FLAG_END_STREAM, encode
from workbench.wire.inflate import InflateBudget, use_budget

RUN = "/agent.v1.AgentService/Run"
CLIENT, SERVER = "10.0.0.1:50000", "10.0.0.2:443"
T0 = 1_767_225_600_000_000
META = {"file": "test.pcap", "file_sha256": "", "format": "pcap", "dissector": "tshark", "keylog": True}


def _connection(stream: int, first: int, *, client_random: str, ended: bool = True,
                port: int = 50000) -> list[Packet]:
    """One TLS connection with one h2 Run (its response ended when ``ended``), closed by both FINs."""
    client, n = f"10.0.0.1:{port}", first

    def pkt(src: str, dst: str, flags: int = TCP_ACK, **kw: Any) -> Packet:
        nonlocal n
        n += 1
        return Packet(n, T0 + n * 1000, 120, stream, src, dst, flags, **kw)

    req = encode(b"") + encode(b"", FLAG_END_STREAM)
    resp = encode(b"") + (encode(b"{}", FLAG_END_STREAM) if ended else b"")
    request_headers = [(":method", "POST"), (":path", RUN), (":authority", "api2.cursor.sh"),
                       ("content-type", "application/connect+proto"), ("authorization", "Bearer secret-token")]
    return [
        pkt(client, SERVER, TCP_SYN),
        pkt(SERVER, client, TCP_SYN | TCP_ACK),
        pkt(client, SERVER, client_hello=True, client_random=client_random, sni="api2.cursor.sh"),
        pkt(client, SERVER, h2=[H2Frame(H2_HEADERS, 1, H2_END_HEADERS, 60, headers=request_headers),
                                H2Frame(H2_DATA, 1, H2_END_STREAM, len(req), data=req)]),
        pkt(SERVER, client, h2=[H2Frame(H2_HEADERS, 1, H2_END_HEADERS, 20,
                                        headers=[(":status", "200"), ("content-type", "application/connect+proto")]),
                                H2Frame(H2_DATA, 1, H2_END_STREAM if ended else 0, len(resp), data=resp)]),
        pkt(client, SERVER, TCP_FIN | TCP_ACK),
        pkt(SERVER, client, TCP_FIN | TCP_ACK),
    ]


@pytest.fixture(autouse=True)
def _budget() -> Iterator[None]:
    with use_budget(InflateBudget.for_import()):
        yield


def _pipelined(db: Path, packets: list[Packet]) -> tuple[int, Any]:
    """(sessions stored before the capture's end, the import's outcome)."""
    store = Store(db)
    try:
        progress = Progress("test.pcap", enabled=False)
        imp = capture_importer(store, default_decoder(), dict(META), lambda _m: None, progress)
        early = EarlyRuns(imp)
        reassembler = Reassembler()
        early.read(packets, reassembler, progress)
        early.idle()  # as when the reader has caught up with tshark, before its output ends
        before_end = len(store.query("SELECT session_id FROM sessions"))
        readable = [ex for ex in agent_exchanges(reassembler.finish()) if ex.path]
        return before_end, early.finish(readable, progress)
    finally:
        store.close()


def _at_the_end(db: Path, packets: list[Packet]) -> Any:
    store = Store(db)
    try:
        reassembler = Reassembler()
        for p in packets:
            reassembler.feed(p)
        readable = [ex for ex in agent_exchanges(reassembler.finish()) if ex.path]
        return write_exchanges(store, default_decoder(), readable, source=SOURCE, file_meta=dict(META),
                               warn=lambda _m: None, builder=WirePlanBuilder)
    finally:
        store.close()


def _same_rows(a: Path, b: Path) -> None:
    for sql in ("SELECT * FROM frames ORDER BY session_id, seq", "SELECT * FROM sessions ORDER BY session_id"):
        assert query_rows(a, sql) == query_rows(b, sql)


def _renumbered(packets: list[Packet]) -> list[Packet]:
    """Packets numbered and timed in the order given (capture order)."""
    for i, p in enumerate(packets, 1):
        p.number, p.ts_us = i, T0 + i * 1000
    return packets


def _both(tmp_path: Path, packets: list[Packet], preloaded: bool = False) -> tuple[int, Any, Any]:
    """Both imports; ``preloaded``: into databases that hold another capture's session already (so
    the pipelined import looks its sessions up in the database)."""
    packets = _renumbered(packets)
    early_db, end_db = tmp_path / "pipelined.duckdb", tmp_path / "end.duckdb"
    if preloaded:
        other = _renumbered(_connection(7, 0, client_random="ef" * 32, port=50007))
        for db in (early_db, end_db):
            assert _at_the_end(db, other).session_ids
    before_end, piped = _pipelined(early_db, packets)
    whole = _at_the_end(end_db, packets)
    _same_rows(early_db, end_db)
    assert (piped.session_ids, piped.frames, piped.agent) == (whole.session_ids, whole.frames, whole.agent)
    return before_end, piped, early_db


def test_a_run_is_stored_when_its_connection_ends(tmp_path: Path) -> None:
    packets = _connection(0, 0, client_random="ab" * 32)
    packets += _connection(1, len(packets), client_random="cd" * 32, ended=False, port=50001)[:-2]  # still open
    before_end, piped, _db = _both(tmp_path, packets)
    assert before_end == 1 and len(piped.session_ids) == 2


def test_sessions_are_listed_in_request_order_whichever_ended_first(tmp_path: Path) -> None:
    first = _connection(0, 0, client_random="ab" * 32)
    second = _connection(1, len(first), client_random="cd" * 32, port=50001)
    packets = first[:-2] + second + first[-2:]  # the second connection ends first
    before_end, piped, _db = _both(tmp_path, packets)  # the same session_ids, in the same order
    assert before_end == 2 and len(piped.session_ids) == 2


@pytest.mark.parametrize("preloaded", [False, True])
@pytest.mark.parametrize("late", ["rst", "rst_stream"])
def test_a_packet_after_the_end_that_changes_the_run_is_taken_into_account(tmp_path: Path, late: str,
                                                                          preloaded: bool) -> None:
    packets = _connection(0, 0, client_random="ab" * 32, ended=False)
    n = len(packets) + 1
    if late == "rst":  # the response never ended: "reset by the server", not "closed by the client"
        packets.append(Packet(n, T0 + n * 1000, 60, 0, SERVER, CLIENT, TCP_RST))
    else:  # hostile: an h2 frame after both FINs
        packets.append(Packet(n, T0 + n * 1000, 60, 0, SERVER, CLIENT, TCP_ACK,
                              h2=[H2Frame(H2_RST_STREAM, 1, 0, 4, error_code=2)]))
    before_end, piped, db = _both(tmp_path, packets, preloaded)
    assert before_end == 1 + preloaded  # written early, then rewritten as the whole capture says
    (row,) = query_rows(db, "SELECT error FROM sessions WHERE session_id = ?", piped.session_ids)
    assert ("reset by the server" if late == "rst" else "stream reset by server") in row["error"]


@pytest.mark.parametrize("preloaded", [False, True])
def test_a_connection_seen_twice_is_written_in_capture_order(tmp_path: Path, preloaded: bool) -> None:
    first = _connection(0, 0, client_random="ab" * 32)
    again = _connection(1, len(first), client_random="ab" * 32)  # same TLS client random: same session
    # the first copy's connection ends after the second's: written early, the second would be stored
    packets = first[:-2] + again + first[-2:]
    before_end, piped, db = _both(tmp_path, packets, preloaded)
    # the second copy is a repeat within the file, not a session already imported
    assert before_end == 1 + preloaded and not piped.result.skipped and piped.session_ids == piped.result.written
    packets_stored = [r["p"] for r in query_rows(db, "SELECT (meta->>'packet')::INT AS p FROM frames "
                                                     "WHERE session_id = ? ORDER BY seq", piped.session_ids)]
    assert max(packets_stored) <= len(first) - 2  # the first copy's frames


@pytest.mark.parametrize("preloaded", [False, True])
def test_a_connection_seen_again_in_full_is_stored_as_that_copy_alone(tmp_path: Path, preloaded: bool) -> None:
    """The first copy cut off (its response never ends, no FINs), the second whole: one session, as
    the whole copy alone gives (the second copy rebuilds the session the first wrote in this import)."""
    first = _connection(0, 0, client_random="ab" * 32, ended=False)[:-2]
    again = _connection(1, len(first), client_random="ab" * 32, port=50001)
    _before_end, piped, db = _both(tmp_path, first + again, preloaded)
    alone_db = tmp_path / "alone.duckdb"
    alone = _at_the_end(alone_db, _renumbered(_connection(1, 0, client_random="ab" * 32, port=50001)))
    assert piped.session_ids == alone.session_ids and piped.frames == alone.frames
    assert piped.result.written == piped.session_ids and not piped.result.updated

    def rows(path: Path, offset: int) -> list[dict[str, Any]]:
        out = query_rows(path, "SELECT * FROM frames WHERE session_id = ? ORDER BY seq", piped.session_ids)
        return [{**r, "ts": None, "meta": r["meta"].replace(f'"packet": {json.loads(r["meta"])["packet"]}',
                                                            f'"packet": {json.loads(r["meta"])["packet"] - offset}')}
                for r in out]

    assert rows(db, len(first)) == rows(alone_db, 0)
    cols = "session_id, transport, status, error, frame_count"
    assert query_rows(db, f"SELECT {cols} FROM sessions WHERE session_id = ?", piped.session_ids) == \
        query_rows(alone_db, f"SELECT {cols} FROM sessions")

"""A response that ends with a trailers HEADERS frame (``grpc-status: 0``) loses no frame in a pcap.

tshark reports such a body twice: each DATA frame with its own bytes, then the whole body once more
at the HEADERS frame that ends the stream. The importer used to pair tshark's payloads with DATA
frames by count only, so every server DATA frame of that packet was dropped (exit 0, no note).
Real packets: tcpdump on ``lo`` while an HTTP/2 client talks TLS to a scripted HTTP/2 upstream
(the hostile suite's rig), with and without trailers, the same envelopes either way.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import packet_capture_env
import pytest
from pcap_rig import Tcpdump, import_pcap
from support import query_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from live import HostileUpstream, send  # noqa: E402
from strategies import CLIENT_MSG, Exchange, credential_sites  # noqa: E402

from workbench.ingest.tshark import H2_DATA, H2_HEADERS, parse_packet  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileUpstream]:
    packet_capture_env.need()
    server = HostileUpstream(tmp_path_factory.mktemp("pcap-trailers-cert"))
    yield server
    server.close()


def _exchange(trailers: list[tuple[bytes, bytes]], client_body: bool) -> Exchange:
    site = next(s for s in credential_sites() if s.root == CLIENT_MSG)
    return Exchange(canary="wbcanary0trailers", secret_headers=["authorization"], odd_headers=[],
                    client_sites=[site] if client_body else [], server_sites=[], gzip_client=[False] * client_body,
                    gzip_server=[], trailers=trailers, reset=False, timestamp=1.7e9, text_frames=3)


@pytest.mark.parametrize("client_body", [True, False], ids=["request-body", "empty-request-body"])
@pytest.mark.parametrize("trailers", [[(b"grpc-status", b"0")], []], ids=["trailers", "no-trailers"])
def test_response_ending_in_trailers_keeps_every_server_frame(upstream: HostileUpstream, tmp_path: Path,
                                                             trailers: list[tuple[bytes, bytes]],
                                                             client_body: bool) -> None:
    ex = _exchange(trailers, client_body)
    pcap, keys, db = tmp_path / "wire.pcap", tmp_path / "keys.log", tmp_path / "c.duckdb"
    rid = str(uuid.uuid4())
    with Tcpdump(pcap, upstream.port):
        key = uuid.uuid4().hex.encode()
        upstream.script[key] = ex
        assert send(None, upstream.port, upstream.cert, key, ex, rid, keylog=keys) == "ended"
    r = import_pcap(pcap, db, keys, "--json")
    assert r.returncode == 0, r.stderr[-1500:]
    assert "Traceback" not in r.stderr
    rows = query_rows(db, "SELECT f.direction, f.payload FROM frames f JOIN sessions s USING (session_id) "
                     "WHERE s.request_id = ? ORDER BY f.seq", [rid])
    server = [bytes(row["payload"] or b"") for row in rows if row["direction"] == "server"]
    # three text deltas and the end-of-stream envelope, whatever ended the HTTP/2 stream
    assert len(server) == ex.text_frames + 1, rows
    assert all(f"text {i}".encode() in p for i, p in enumerate(server[:3]))
    client = [row for row in rows if row["direction"] == "client"]
    assert len(client) == len(ex.client_sites)
    meta = query_rows(db, "SELECT CAST(s.meta AS VARCHAR) AS meta FROM sessions s WHERE s.request_id = ?", [rid])
    assert "do not line up" not in str(meta) and "no payload" not in str(meta)


def test_tshark_body_copy_at_trailers_is_not_taken_for_a_data_frame() -> None:
    """tshark 4.0's fields for one packet holding SETTINGS ack, response HEADERS, one DATA frame and
    the trailers HEADERS (END_STREAM): two payloads for one DATA frame, the second the body copy."""
    body = "000000000c0a0a0a080a06746578742030"
    layers = {"frame_number": ["14"], "frame_time_epoch": ["1795793354.317"], "tcp_stream": ["0"],
              "http2_type": ["4", "1", "0", "1"], "http2_streamid": ["0", "1", "1", "1"],
              "http2_flags": ["0x01", "0x04", "0x00", "0x05"], "http2_length": ["0", "21", "17", "12"],
              "http2_data_data": [body, body], "http2_header_count": ["2", "1"],
              "http2_header_name": ["content-type", "x", "grpc-status"], "http2_header_value": ["a", "b", "0"]}
    pkt = parse_packet(layers)
    assert pkt is not None and pkt.problem is None
    data = [f for f in pkt.h2 if f.type == H2_DATA]
    assert [f.data for f in data] == [bytes.fromhex(body)]
    assert [f.headers for f in pkt.h2 if f.type == H2_HEADERS][-1] == [("grpc-status", "0")]
    # an empty DATA frame (END_STREAM only) comes as "<MISSING>": an empty payload, not a traceback
    empty = parse_packet({**layers, "http2_type": ["0"], "http2_streamid": ["3"], "http2_flags": ["0x01"],
                          "http2_length": ["0"], "http2_data_data": ["<MISSING>"], "http2_header_count": [],
                          "http2_header_name": [], "http2_header_value": []})
    assert empty is not None and empty.problem is None and empty.h2[0].data == b""

"""Source: ``workbench import FILE.pcap [--keylog KEYS]`` (read by tshark).

- ``test_pcap_import_hostile_records``: packet records of arbitrary bytes, lying record lengths
  and odd timestamps behind a valid pcap header. Invariant (a).
- ``test_pcap_import_hostile_wire``: real packets (tcpdump on ``lo``) of the hostile HTTP/2 client
  talking TLS straight to the hostile upstream (live.py), its keys logged: header bytes that are
  not UTF-8, odd trailers, resets, the canary in every credential header and field, plain and
  gzip'd (inflated, or ``compressed`` under a tiny budget). Invariants (a), (b) every envelope of
  every answered exchange stored, (c) canary on no file nor in any view.

Needs tshark (and tcpdump and root for the second): skipped where missing, a failure in CI
(tests/packet_capture_env.py).
"""

from __future__ import annotations

import shutil
import struct
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import packet_capture_env
import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, view_outputs
from live import HostileUpstream, send
from strategies import Exchange, exchanges, hostile, tried
from support import env_without_proxy, run_workbench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingest"))
from pcap_rig import Tcpdump  # noqa: E402  (the pcap import tests' tcpdump, stopped on a sentinel packet)

pytestmark = pytest.mark.slow
TINY_BUDGET = "0.00005"

PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)  # Ethernet
records = st.lists(st.tuples(st.sampled_from([0, 1_700_000_000, 2**32 - 1]), st.integers(0, 999_999),
                             st.binary(max_size=120), st.booleans()), min_size=1, max_size=20)


@hostile(4)
@given(recs=records)
def test_pcap_import_hostile_records(recs: list[tuple[int, int, bytes, bool]], scratch: Callable[[], Path]) -> None:
    if shutil.which("tshark") is None:
        packet_capture_env.unavailable(f"tshark is not installed ({packet_capture_env.INSTALL})")
    tried("test_pcap_import_hostile_records")
    d = scratch()
    out = bytearray(PCAP_HEADER)
    for sec, usec, data, lie in recs:
        caplen = len(data) + (1000 if lie else 0)  # a record claiming more bytes than the file holds
        out += struct.pack("<IIII", sec, usec, caplen, caplen) + data
    path = d / "in" / "hostile.pcap"
    path.write_bytes(bytes(out))
    r = run_workbench("import", str(path), "--db", str(d / "run" / "c.duckdb"), "--format", "pcap")
    clean_exit(r, [path], "workbench import (pcap)")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileUpstream]:
    packet_capture_env.need()
    server = HostileUpstream(tmp_path_factory.mktemp("hostile-pcap-cert"))
    yield server
    server.close()


@hostile(4)
@given(batch=st.lists(exchanges(wire_safe=True, timestamps_too=False), min_size=1, max_size=3),
       tiny_budget=st.booleans())
def test_pcap_import_hostile_wire(batch: list[Exchange], tiny_budget: bool, upstream: HostileUpstream,
                                  scratch: Callable[[], Path]) -> None:
    tried("test_pcap_import_hostile_wire")
    d = scratch()
    pcap, keys, db = d / "in" / "wire.pcap", d / "in" / "keys.log", d / "run" / "capture.duckdb"
    ends: dict[str, str] = {}
    with Tcpdump(pcap, upstream.port):
        for ex in batch:
            key = uuid.uuid4().hex.encode()
            upstream.script[key] = ex
            rid = str(uuid.uuid4())
            ends[rid] = send(None, upstream.port, upstream.cert, key, ex, rid, keylog=keys)
    env = env_without_proxy({"WORKBENCH_INFLATE_FRAME_MB": TINY_BUDGET} if tiny_budget else None)
    r = run_workbench("import", str(pcap), "--keylog", str(keys), "--db", str(db), "--json", env=env)
    clean_exit(r, [pcap], "workbench import (pcap, decrypted)")  # (a)
    assert r.returncode == 0, f"a decryptable capture was not imported: {r.stderr[-1500:]}"
    for (rid, end), ex in zip(ends.items(), batch, strict=True):  # (b)
        got = query(db, "SELECT count(*) FROM frames f JOIN sessions s USING (session_id) WHERE s.request_id = ?",
                    rid)[0][0]
        assert got >= ex.frames_in, f"request {rid} ({end}): {ex.frames_in} envelopes on the wire, {got} stored"
    outputs = view_outputs(db, d / "run" / "out")
    for ex in batch:  # (c)
        canary_nowhere(d / "run", ex.canary, {**outputs, "import --json": r.stdout + r.stderr})

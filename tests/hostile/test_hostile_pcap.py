"""Source: ``workbench import FILE.pcap`` (read by tshark), with packet records of arbitrary bytes,
lying record lengths and timestamps past year 9999 behind a valid pcap header.

Invariant: (a) no traceback: exit 0/1, or 2 naming the file. Needs tshark: skipped where it is
missing, a failure in CI (tests/packet_capture_env.py). Credentials inside decrypted TLS are
covered by the flow, HAR and live properties, which store through the same writer.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import packet_capture_env
import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import clean_exit
from strategies import hostile, tried
from support import run_workbench

pytestmark = pytest.mark.slow

PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)  # Ethernet
records = st.lists(st.tuples(st.sampled_from([0, 1_700_000_000, 2**32 - 1]), st.integers(0, 999_999),
                             st.binary(max_size=120), st.booleans()), min_size=1, max_size=20)


@pytest.fixture(autouse=True)
def _tshark() -> None:
    if shutil.which("tshark") is None:
        packet_capture_env.unavailable(f"tshark is not installed ({packet_capture_env.INSTALL})")


@hostile(6)
@given(recs=records)
def test_pcap_import_hostile_records(recs: list[tuple[int, int, bytes, bool]], scratch: Callable[[], Path]) -> None:
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

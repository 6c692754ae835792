"""tshark's fields output read as exactly as its JSON (EK) output: header names and values with
tabs, newlines, carriage returns, commas, backslashes, bytes that are not UTF-8 or ASCII, empty
values; an empty DATA frame; a line that is not tshark's.

The pcap is written here (cleartext HTTP/2 on one TCP connection, HPACK from the ``hpack`` package
mitmproxy uses) and read by the real tshark twice, with the importer's own command and with the
same fields as EK JSON; every packet's fields must agree.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import hpack
import packet_capture_env
import pytest

from workbench.ingest.tshark import DISPLAY_FILTER, FIELDS, command, layers_of, parse_packet

PORT = 8080
HEADERS = [(b":method", b"POST"), (b":path", b"/agent.v1.AgentService/Run"), (b":scheme", b"http"),
           (b":authority", b"h"), (b"x-tab", b"a\tb"), (b"x-nl", b"a\nb"), (b"x-cr", b"a\rb"), (b"x-comma", b"a,b"),
           (b"x-unit", b"a\x1fb"), (b"x-backslash", b"a\\b"), (b"x-windows", b"C:\\Users\\tom\\new\\rates"),
           (b"x-ends", b"a\\"), (b"x-not-utf8", b"\\t\xff\xfe"), (b"x-utf8", "é✓".encode()), (b"x-quote", b'a"b'),
           (b"x-empty", b""), (b"x\\tname", b"v")]


def _h2(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _write_pcap(path: Path, payloads: list[bytes]) -> None:
    """One TCP connection's client segments on Ethernet/IPv4, in a classic pcap file."""
    records, seq = [], 1
    for data in payloads:
        tcp = struct.pack(">HHIIBBHHH", 40000, PORT, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + data
        seq += len(data)
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, bytes((127, 0, 0, 1)),
                         bytes((127, 0, 0, 2))) + tcp
        records.append(b"\x00" * 12 + b"\x08\x00" + ip)
    with path.open("wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, rec in enumerate(records):
            f.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(rec), len(rec)) + rec)


def _h2c_command(tshark: str, pcap: Path) -> list[str]:
    """The importer's command, told the port speaks cleartext HTTP/2 (its filter wants TLS)."""
    cmd = command(tshark, pcap, None)
    cmd[cmd.index(DISPLAY_FILTER)] = "tcp"
    return [cmd[0], "-d", f"tcp.port=={PORT},http2", *cmd[1:]]


@pytest.fixture
def tshark() -> str:
    packet_capture_env.need()
    found = shutil.which("tshark")
    assert found is not None
    return found


@pytest.mark.slow
def test_fields_read_as_tshark_json_reads_them(tshark: str, tmp_path: Path) -> None:
    pcap = tmp_path / "h2c.pcap"
    block = hpack.Encoder().encode(HEADERS)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2(4, 0, 0, b"")
    _write_pcap(pcap, [preface + _h2(1, 0x4, 1, block), _h2(0, 0, 1, b""), _h2(0, 0, 1, b"ab") + _h2(0, 1, 1, b"")])
    fields_cmd = _h2c_command(tshark, pcap)
    t = fields_cmd.index("-T")
    ek_cmd = fields_cmd[:t] + ["-T", "ek"] + fields_cmd[fields_cmd.index("-e"):]
    lines = subprocess.run(fields_cmd, capture_output=True, check=True).stdout.split(b"\n")
    assert lines.pop() == b""
    docs = [json.loads(line)["layers"] for line in
            subprocess.run(ek_cmd, capture_output=True, check=True).stdout.splitlines()
            if not line.startswith(b'{"index"')]
    assert len(lines) == len(docs) == 3
    for line, doc in zip(lines, docs, strict=True):
        assert layers_of(line) == doc
        assert parse_packet(layers_of(line) or {}) == parse_packet(doc)
    headers = dict(parse_packet(docs[0]).h2[1].headers)  # type: ignore[union-attr]
    assert headers["x-windows"] == "C:\\Users\\tom\\new\\rates" and headers["x-tab"] == "a\tb"
    assert headers["x\\tname"] == "v" and headers["x-empty"] == "" and headers["x-not-utf8"] == "\\t\ufffd\ufffd"


def test_a_value_with_a_control_character_and_a_backslash_sequence_is_read_as_escapes() -> None:
    """The one case the lengths cannot settle: tshark prints a tab as ``\\t`` and a backslash
    followed by ``t`` alike, and the value holds both; it reads with every escape undone."""
    cols = [""] * len(FIELDS)
    cols[FIELDS.index("http2.header.value")] = "a\\tb\\tc"
    cols[FIELDS.index("http2.header.value.length")] = "6"  # "a<TAB>b\\tc"
    layers = layers_of("\t".join(cols).encode())
    assert layers is not None and layers["http2_header_value"] == ["a\tb\tc"]


def test_values_keep_their_own_backslashes_when_their_length_says_so() -> None:
    cols = [""] * len(FIELDS)
    cols[FIELDS.index("http2.header.name")] = "\rx"  # two names: the first empty
    cols[FIELDS.index("http2.header.value")] = "C:\\new\ra\\tb"
    cols[FIELDS.index("http2.header.value.length")] = "6\r3"
    layers = layers_of("\t".join(cols).encode())
    assert layers is not None
    assert layers["http2_header_name"] == ["", "x"] and layers["http2_header_value"] == ["C:\\new", "a\tb"]


def test_a_line_without_every_field_is_not_read() -> None:
    assert layers_of(b"this is not a line of fields") is None
    assert layers_of(b"\t".join([b"1"] * (len(FIELDS) + 1))) is None
    assert layers_of(b"\t" * (len(FIELDS) - 1)) == {}
